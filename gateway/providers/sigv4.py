"""AWS Signature Version 4, by botocore (the ``fencegate[ses]`` extra).

Never our own crypto: botocore's ``SigV4Auth`` signs a method, URL, headers
and body and hands the headers back, and aiohttp sends exactly those. Every
request to a provider whose preset authenticates with ``sigv4`` is signed
here, ``/v1/email`` and ``/v1/http`` alike, after every other header is set.
"""

from __future__ import annotations

from gateway.config import HttpProviderConfig


def sign(config: HttpProviderConfig, method: str, url: str, headers: dict[str, str],
         body: bytes) -> dict[str, str]:
    """``headers`` with ``Authorization``, ``X-Amz-Date`` (and
    ``X-Amz-Security-Token``) added, over exactly this method, URL, headers
    and body, for the preset's service in the provider's region."""
    from botocore.auth import SigV4Auth
    from botocore.awsrequest import AWSRequest
    from botocore.credentials import Credentials

    assert config.preset is not None and config.preset.auth.service, "a sigv4 preset"
    assert config.aws is not None and config.region is not None, "its credentials and region"
    request = AWSRequest(method=method, url=url, data=body, headers=dict(headers))
    credentials = Credentials(config.aws.access_key_id, config.aws.secret_access_key,
                              config.aws.session_token)
    SigV4Auth(credentials, config.preset.auth.service, config.region).add_auth(request)
    return dict(request.headers.items())
