"""Who is calling: API keys (stored as sha256) to clients, and the resources
each client may act on (glob patterns)."""

from __future__ import annotations

import hashlib
from fnmatch import fnmatchcase

from gateway.api.problems import Problem
from gateway.config import ClientConfig


def key_sha256(api_key: str) -> str:
    """The key's hash, over the bytes the caller sent: aiohttp reads header
    bytes that are not UTF-8 as lone surrogates, which surrogateescape turns
    back into those bytes (a strict encode raised: a 500 for anyone)."""
    return hashlib.sha256(api_key.encode("utf-8", "surrogateescape")).hexdigest()


class Authenticator:
    def __init__(self, clients: tuple[ClientConfig, ...]) -> None:
        self._by_hash = {key: c for c in clients for key in c.keys_sha256}

    def client(self, authorization: str | None) -> ClientConfig:
        """The client behind an ``Authorization: Bearer`` header, or 401."""
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Problem("unauthenticated", "send Authorization: Bearer <api key>",
                          headers={"WWW-Authenticate": "Bearer"})
        client = self._by_hash.get(key_sha256(token.strip()))
        if client is None:
            raise Problem("unauthenticated", "unknown API key",
                          headers={"WWW-Authenticate": "Bearer"})
        return client


def check_resource(client: ClientConfig, resource: str) -> None:
    """403 unless one of the client's patterns matches ``resource``. The
    detail names the resource and the client's own patterns: the caller sent
    the one and is the other's client, so neither tells it anything new."""
    if not any(fnmatchcase(resource, pattern) for pattern in client.resources):
        raise Problem("forbidden_resource",
                      f"client {client.name!r} may not act on {resource!r}: its resource "
                      f"patterns are {', '.join(client.resources)} (the [[clients]] "
                      "table's resources)")


def check_provider(client: ClientConfig, provider: str, path: str | None = None) -> None:
    """403 unless the client may use ``provider`` (its ``providers``) and,
    for an HTTP provider, ``path`` (below the base URL, as sent: its
    ``provider_paths``)."""
    if not client.may_use(provider):
        raise Problem("forbidden_provider",
                      f"client {client.name!r} may not use provider {provider[:64]!r}")
    if path is not None and not client.may_use_path(provider, path):
        raise Problem("forbidden_provider",
                      f"client {client.name!r} may not use this path of provider "
                      f"{provider[:64]!r}")
