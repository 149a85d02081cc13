"""Applying a preset (gateway/config/presets.py) to one provider's table of the file.

A preset fills in what the file leaves out; what the file says wins, except
where it would make the gateway unsafe: an idempotency header the provider
does not dedupe on, or a window longer than the one it documents, would make
a resend a duplicate, so both are refused at start.
"""

from __future__ import annotations

import base64
import importlib.util
import os
import re
from dataclasses import dataclass, field
from typing import Any

from gateway.config.presets import PRESETS, Preset
from gateway.config.reader import Reader

_REGION = re.compile(r"[a-z]{2}(?:-[a-z]+)+-[0-9]{1,2}")
_DOMAIN = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,62}"
                     r"(?:\.[A-Za-z0-9][A-Za-z0-9-]{0,62})*)?")
_HEADER_NAME = re.compile(r"[A-Za-z0-9-]{1,64}")

#: keys a preset may add to an HTTP provider's table, by what they configure
_SIGV4_KEYS = {"aws_access_key_id_env", "aws_secret_access_key_env", "aws_session_token_env"}


def installed(module: str) -> bool:
    """Whether ``module`` can be imported (an optional extra is installed)."""
    return importlib.util.find_spec(module) is not None


@dataclass(frozen=True)
class AwsCredentials:
    """What SigV4 signs with (the ``ses`` preset)."""

    access_key_id: str = field(repr=False)
    secret_access_key: str = field(repr=False)
    session_token: str | None = field(default=None, repr=False)


def preset_of(r: Reader, kind: str) -> Preset | None:
    """The preset the table names, checked against the provider's kind."""
    name = r.get("preset", str)
    if name is None:
        return None
    preset = PRESETS.get(name)
    if preset is None:
        raise r.error("preset", f"{name!r} is not a preset; known: {', '.join(sorted(PRESETS))}")
    if preset.kind != kind:
        raise r.error("preset", f"{name!r} configures a {preset.kind} provider, not {kind}")
    return preset


def preset_keys(preset: Preset | None) -> set[str]:
    """The keys a preset adds to what a provider's table may hold."""
    if preset is None:
        return set()
    keys = {"preset"}
    if preset.kind == "http":
        keys.add("email")
    if preset.auth.scheme == "sigv4":
        keys |= _SIGV4_KEYS
    elif preset.auth.env:
        keys.add("api_key_env")
    return keys | set(preset.requires)


def idempotency(r: Reader, kind: str, preset: Preset | None,
                default_http_header: str) -> tuple[str, float]:
    """The idempotency header and window: the file's, within what the preset
    documents."""
    if preset is None:
        header = r.get("idempotency_header", str, default_http_header if kind == "http" else "")
        window = r.number("idempotency_window_seconds", 0, 0, 366 * 86400)
    else:
        documented = preset.idempotency
        header = r.get("idempotency_header", str, documented.header)
        window = r.number("idempotency_window_seconds", documented.window_seconds, 0,
                          366 * 86400)
        if header and not documented.header:
            raise r.error("idempotency_header", f"the {preset.name} preset documents no "
                          "idempotency key: a header it ignores would make resends "
                          "duplicates; leave it out")
        if header and header.lower() != documented.header.lower():
            raise r.error("idempotency_header", f"the {preset.name} preset dedupes on "
                          f"{documented.header!r} only (or \"\" for none)")
        if header and window > documented.window_seconds:
            raise r.error("idempotency_window_seconds", f"is longer than the "
                          f"{documented.window_seconds:g} s the {preset.name} preset "
                          "documents: a resend after it would be a duplicate")
    if header and not _HEADER_NAME.fullmatch(header):
        raise r.error("idempotency_header", "must be a header name (A-Z a-z 0-9 -)")
    return header, window


def _env_secret(r: Reader, key: str, default_env: str, preset: Preset,
                required: bool = True) -> str | None:
    """The secret in the environment variable ``key`` names, or the preset's
    default variable when the file names none."""
    named = key in r.table
    env = r.get(key, str, default_env)
    value = os.environ.get(env) if env else None
    if value is None and (required or named):
        why = "" if named else f" ({key} is not set in the file: the {preset.name} preset's " \
                               "default)"
        raise r.error(key, f"names the environment variable {env}, which is not set{why}")
    return value


def http_settings(r: Reader, preset: Preset) -> dict[str, Any]:
    """What an HTTP preset fills into ``HttpProviderConfig``."""
    if "authorization_env" in r.table:
        raise r.error("authorization_env", f"the {preset.name} preset authenticates itself "
                      "(api_key_env names its secret)")
    out: dict[str, Any] = {"preset": preset, "not_acted_statuses": preset.not_acted_statuses,
                           "unknown_statuses": preset.unknown_statuses, "pace": preset.pace}
    base_url = preset.base_url
    if "region" in preset.requires:
        region = r.get("region", str, required=True)
        if not _REGION.fullmatch(region):
            raise r.error("region", "must be an AWS region such as \"eu-west-1\"")
        out["region"] = region
        base_url = base_url.format(region=region)
    if "domain" in preset.requires:
        domain = r.get("domain", str, required=True)
        if not _DOMAIN.fullmatch(domain):
            raise r.error("domain", "must be the sending domain, such as \"mg.example.com\"")
        out["domain"] = domain.lower()
    out["base_url"] = r.get("base_url", str, base_url)
    email = r.get("email", bool, preset.email_api is not None)
    if email and preset.email_api is None:
        raise r.error("email", f"the {preset.name} preset has no email API; reach it through "
                      "/v1/http")
    out["email"] = email
    out.update(_http_auth(r, preset))
    return out


def _http_auth(r: Reader, preset: Preset) -> dict[str, Any]:
    auth = preset.auth
    if auth.scheme == "sigv4":
        if not installed("botocore"):
            raise r.error("preset", f"the {preset.name} preset signs its requests with "
                          "botocore, which is not installed: pip install 'fencegate[ses]'")
        key_id, secret, token = auth.env
        return {"aws": AwsCredentials(
            _env_secret(r, "aws_access_key_id_env", key_id, preset) or "",
            _env_secret(r, "aws_secret_access_key_env", secret, preset) or "",
            _env_secret(r, "aws_session_token_env", token, preset, required=False))}
    secret = _env_secret(r, "api_key_env", auth.env[0], preset) or ""
    if auth.scheme == "bearer":
        headers = {"Authorization": f"Bearer {secret}"}
    elif auth.scheme == "header":
        headers = {auth.header: secret}
    elif auth.scheme == "basic":
        token = base64.b64encode(f"{auth.username}:{secret}".encode()).decode()
        headers = {"Authorization": f"Basic {token}"}
    else:
        raise AssertionError(f"an HTTP preset with {auth.scheme} authentication")
    return {"auth_headers": headers}


def smtp_settings(r: Reader, preset: Preset) -> dict[str, Any]:
    """What an SMTP preset fills in: host, port, TLS, and the login when the
    provider documents a fixed user name (the secret from ``api_key_env``)."""
    out: dict[str, Any] = {"preset": preset}
    if preset.host:
        out["host"] = preset.host
    if preset.port:
        out["port"] = preset.port
    out["tls"] = preset.tls
    if preset.auth.username:
        if "username_env" in r.table or "password_env" in r.table:
            raise r.error("username_env", f"the {preset.name} preset logs in as "
                          f"{preset.auth.username!r} with api_key_env's secret")
        out["username"] = preset.auth.username
        out["password"] = _env_secret(r, "api_key_env", preset.auth.env[0], preset)
    return out
