"""/openapi.json lists every answer of every route, with real schemas (the
fuzzer checks each answer it gets against them, tests/hostile/), and HEAD
works on the probes."""

from __future__ import annotations

from gateway.api.openapi import document
from gateway.api.routes import ROUTES
from tests.integration.conftest import Gw


def test_lease_routes_list_their_refusals_and_shapes() -> None:
    paths = document(ROUTES)["paths"]
    for path in ("/v1/leases/claim", "/v1/leases/renew", "/v1/leases/release"):
        answers = paths[path]["post"]["responses"]
        assert {"200", "400", "401", "403", "408", "413", "503"} <= set(answers), path
        ok = answers["200"]["content"]["application/json"]["schema"]
        assert ok.get("required"), path  # a real schema, not just "an object"
    forbidden = paths["/v1/leases/claim"]["post"]["responses"]["403"]
    schema = forbidden["content"]["application/problem+json"]["schema"]
    assert schema["allOf"][1]["properties"]["code"]["enum"] == ["forbidden_resource"]
    assert set(paths["/v1/leases/{resource}"]["get"]["responses"]) >= {"400", "403"}
    assert set(paths["/healthz"]) == {"get", "head"} and set(paths["/readyz"]) == {"get", "head"}


async def test_head_on_the_probes(gw: Gw) -> None:
    for path in ("/healthz", "/readyz"):
        async with gw.http.head(gw.url + path) as r:
            assert r.status == 200, path
            assert await r.read() == b""
