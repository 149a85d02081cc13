"""A client uses only the providers (and, if configured, the paths) it is
configured for (issue 22, "decide and document").

``providers = [...]`` in a ``[[clients]]`` table limits the client to those
providers; ``provider_paths = {name = [prefix, ...]}`` further limits an HTTP
provider to paths under those prefixes (whole segments). Anything else is
refused 403 ``forbidden_provider`` before the body is read, with nothing
reserved and nothing sent. Without the key a client may use every provider
(today's configurations keep working: docs/gateway.md says why).
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable

import pytest

from gateway import config as gconfig
from gateway.errors import ConfigError
from tests.integration.conftest import Gw

MakeGw = Callable[..., Awaitable[Gw]]


async def _limited(make_gw: MakeGw) -> Gw:
    return await make_gw(clients={"agents": {
        "providers": ["mail", "crm"], "provider_paths": {"crm": ["v3/objects/contacts"]}}})


async def test_a_provider_not_configured_for_the_client_is_403(make_gw: MakeGw) -> None:
    gw = await _limited(make_gw)
    lease = await gw.leases.claim("run:1", ttl=60)
    assert lease is not None
    status, headers, body = await gw.post("/v1/http/hook/x", gw.headers(lease, "h1"),
                                          json={"a": 1})
    assert (status, body["code"], headers["Fencegate-Problem"]) == \
        (403, "forbidden_provider", "forbidden_provider")
    assert "hook" in body["detail"]
    assert not gw.hook.deliveries
    assert await gw.effect_state("h1") is None  # nothing reserved


async def test_a_path_outside_the_clients_prefixes_is_403(make_gw: MakeGw) -> None:
    gw = await _limited(make_gw)
    lease = await gw.leases.claim("run:1", ttl=60)
    assert lease is not None
    for i, path in enumerate(("v3/objects/companies", "v3/objects/contactsX", "v3",
                              "v3/objects/contacts/../../owners",
                              # decoded it is under the prefix; a server that does
                              # not decode %2F sees one other segment
                              "v3%2Fobjects%2Fcontacts/1")):
        status, _, body = await gw.post(f"/v1/http/crm/{path}", gw.headers(lease, f"p{i}"),
                                        json={})
        assert status in (400, 403), (path, status, body)
        if status == 403:
            assert body["code"] == "forbidden_provider", path
        assert await gw.effect_state(f"p{i}") is None
    status, _, body = await gw.post("/v1/http/crm/v3/objects/contacts/42",
                                    gw.headers(lease, "ok"), json={})
    assert status == 200, body
    assert len(gw.hook.deliveries) == 1


async def test_an_email_provider_not_configured_for_the_client_is_403(
        make_gw: MakeGw) -> None:
    gw = await make_gw(clients={"agents": {"providers": ["crm"]}})
    lease = await gw.leases.claim("run:1", ttl=60)
    assert lease is not None
    status, _, body = await gw.email(lease, "e1", body={"provider": "mail"})
    assert (status, body["code"]) == (403, "forbidden_provider"), body
    assert not gw.smtp.deliveries
    assert await gw.effect_state("e1") is None


async def test_without_the_key_every_provider_is_open(gw: Gw) -> None:
    lease = await gw.leases.claim("run:1", ttl=60)
    assert lease is not None
    status, _, body = await gw.post("/v1/http/hook/x", gw.headers(lease, "h1"), json={})
    assert status == 200, body


def _config(client: dict[str, object]) -> dict[str, object]:
    return {"clients": [{"name": "a", "key_sha256": "0" * 64, "resources": ["run:*"],
                         **client}],
            "providers": {"crm": {"kind": "http", "base_url": "http://127.0.0.1:1/"},
                          "mail": {"kind": "smtp", "host": "127.0.0.1"}}}


@pytest.mark.parametrize(("client", "error"), [
    ({"providers": ["nope"]}, "clients[0].providers"),
    ({"providers": "crm"}, "clients[0].providers"),
    ({"providers": []}, "clients[0].providers"),
    ({"provider_paths": {"crm": ["v3"]}, "providers": ["mail"]},
     "clients[0].provider_paths"),
    ({"provider_paths": {"mail": ["x"]}}, "clients[0].provider_paths"),
    ({"provider_paths": {"crm": "v3"}}, "clients[0].provider_paths"),
    ({"provider_paths": {"crm": ["../x"]}}, "clients[0].provider_paths"),
])
def test_the_keys_are_validated_with_an_error_naming_them(
        client: dict[str, object], error: str) -> None:
    with pytest.raises(ConfigError, match=error.replace("[", r"\[")):
        gconfig.parse(_config(client), "gw.toml")


def test_the_keys_are_read() -> None:
    cfg = gconfig.parse(_config({"providers": ["crm"],
                                 "provider_paths": {"crm": ["/v3/objects/"]}}))
    (client,) = cfg.clients
    assert client.providers == ("crm",)
    assert client.provider_paths == {"crm": ("v3/objects",)}
    (open_client,) = gconfig.parse(_config({})).clients
    assert open_client.providers is None and open_client.provider_paths == {}
