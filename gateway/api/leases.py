"""The lease API over HTTP: claim, renew, release and show, each on the
client's own owners (an owner is stored as ``<client>/<owner>``) and within
the client's resource patterns."""

from __future__ import annotations

from typing import Any

from aiohttp import web

from gateway.api import parsing
from gateway.api.auth import check_resource
from gateway.api.problems import Problem
from gateway.api.request import client_of, gw_of, read_json
from gateway.config import ClientConfig
from leases import InvalidArgument, Unavailable, formats
from leases import policy as lease_policy


def body_field(body: Any, name: str, kind: type | tuple[type, ...], required: bool = True) -> Any:
    if not isinstance(body, dict):
        raise parsing.bad("body", "must be a JSON object")
    value = body.get(name)
    if value is None and not required:
        return None
    if value is None or isinstance(value, bool) or not isinstance(value, kind):
        raise parsing.bad(name, "is required" if value is None else "has the wrong type")
    return value


def _lease_args(request: web.Request, body: Any, *, owner_required: bool,
                fence: bool, ttl: bool) -> dict[str, Any]:
    resource = body_field(body, "resource", str)
    out: dict[str, Any] = {"resource": resource}
    try:
        lease_policy.check_resource(resource)
        owner = body_field(body, "owner", str, required=owner_required)
        out["owner"] = _stored_owner(client_of(request), owner) if owner is not None else None
        if fence:
            out["fence"] = lease_policy.check_fence(body_field(body, "fence", int))
        if ttl:
            out["ttl"] = lease_policy.check_ttl(body_field(body, "ttl_seconds", (int, float)))
    except InvalidArgument as exc:
        raise parsing.bad("body", str(exc)) from None
    check_resource(client_of(request), resource)
    return out


def _stored_owner(client: ClientConfig, owner: str) -> str:
    """Owners over HTTP live in their client's namespace: one client cannot
    renew, release or take over a lease another client claimed, whatever
    owner string it sends."""
    lease_policy.check_owner(owner)
    stored = f"{client.name}/{owner}"
    if len(stored) > lease_policy.MAX_OWNER_LENGTH:
        raise InvalidArgument(f"owner must be at most "
                              f"{lease_policy.MAX_OWNER_LENGTH - len(client.name) - 1} characters")
    return stored


def _shown_owner(client: ClientConfig, stored: str) -> str:
    """The owner as this client named it (another's is shown whole)."""
    prefix = f"{client.name}/"
    return stored.removeprefix(prefix) if stored.startswith(prefix) else stored


def _lease_answer(request: web.Request, resource: str, owner: str, fence: int,
                  expires_at: Any, ttl: float) -> web.Response:
    return web.json_response({"resource": resource,
                              "owner": _shown_owner(client_of(request), owner),
                              "fence": fence, "expires_at": formats.timestamp(expires_at),
                              "ttl_seconds": ttl})


async def claim_lease(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    a = _lease_args(request, await read_json(request), owner_required=False,
                    fence=False, ttl=True)
    # without an owner, one of its own: two claims never share one by accident
    owner = a["owner"] or _stored_owner(client_of(request), gw.leases.new_owner())
    try:
        lease = await gw.leases.claim(a["resource"], a["ttl"], owner=owner)
    except Unavailable:
        if a["owner"] is None:  # granted perhaps, to an owner the caller never learns
            gw.leases.abandon(a["resource"], owner, a["ttl"])
        raise
    if lease is None:
        raise Problem("lease_held", "another owner holds a live lease on this resource")
    return _lease_answer(request, lease.resource, lease.owner, lease.fence, lease.expires_at,
                         a["ttl"])


async def renew_lease(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    a = _lease_args(request, await read_json(request), owner_required=True,
                    fence=True, ttl=True)
    expires = await gw.leases.renew(a["resource"], a["owner"], a["fence"], a["ttl"])
    if expires is None:
        raise Problem("lease_lost", "the lease expired, was released, or belongs to another "
                      "owner or fence")
    return _lease_answer(request, a["resource"], a["owner"], a["fence"], expires, a["ttl"])


async def release_lease(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    a = _lease_args(request, await read_json(request), owner_required=True,
                    fence=True, ttl=False)
    released = await gw.leases.release(a["resource"], a["owner"], a["fence"])
    return web.json_response({"released": released})


async def show_lease(request: web.Request) -> web.StreamResponse:
    gw = gw_of(request)
    resource = request.match_info["resource"]
    try:
        lease_policy.check_resource(resource)
    except InvalidArgument as exc:
        raise parsing.bad("resource", str(exc)) from None
    check_resource(client_of(request), resource)
    info = await gw.leases.show(resource)
    if info is None:
        return web.json_response({"resource": resource, "owner": None, "fence": None,
                                  "expires_at": None, "live": False})
    return web.json_response({"resource": info.resource,
                              "owner": _shown_owner(client_of(request), info.owner),
                              "fence": info.fence,
                              "expires_at": formats.timestamp(info.expires_at),
                              "live": info.live})


# ---- effects, for operators ------------------------------------------------
