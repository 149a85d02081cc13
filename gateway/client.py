"""``GatewayClient``: send effects through the gateway on behalf of a lease.

    GatewayClientError             everything this client raises
    ├── GatewayUnreachable         no answer from the gateway (refused, cut, too slow):
    │                              the effect may or may not have been sent; repeat
    │                              the same key to find out (replayed, or in progress)
    └── GatewayProblem             the gateway refused or failed (its ``code``)
        ├── FenceRejected          412: stale_fence, lease_expired, no_lease, invalid_fence
        ├── EffectInProgress       409, with ``retry_after``
        ├── EffectOutcomeUnknown   409: an operator must resolve it
        ├── IdempotencyKeyReused   422
        ├── ProviderRejected       422: the provider refused for good (email)
        ├── RateLimited            429, with ``retry_after``
        ├── ProviderError          502: safe to retry
        ├── ProviderOutcomeUnknown 502: the provider failed after it may have acted
        ├── Unavailable            503: the database is down, nothing was sent
        ├── Overloaded             503: the gateway could not send in time, nothing was sent
        └── ProviderTimeout        504: outcome unknown

A provider's own answer (any status) to an HTTP effect is a result, not an
error: only the gateway's problems (marked ``Fencegate-Problem``) raise.
Both effect methods take the lease, then the idempotency key.
"""

from __future__ import annotations

import json as jsonlib
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Protocol

import aiohttp

from gateway.wire import (
    FENCE_RESOURCE,
    FENCE_TOKEN,
    IDEMPOTENCY_KEY,
    IDEMPOTENT_REPLAYED,
    PROBLEM_HEADER,
    RETRY_AFTER,
)


class FencedLease(Protocol):
    """What an effect is sent under: a ``leases.Lease``, a ``leases.Job``'s
    lease, or a ``FenceToken``."""

    resource: str
    fence: int

    def check(self) -> None:
        """Raise if this process already knows the lease is lost (a
        ``leases.Lease`` raises ``leases.LeaseLost``), so nothing is attempted."""


@dataclass(frozen=True)
class FenceToken:
    """A resource and a fence held without a ``leases.Lease``: a fence obtained
    over HTTP (``/v1/leases/claim``) or passed along by another process. The
    gateway still refuses it the moment it is stale; nothing checks it here."""

    resource: str
    fence: int

    def check(self) -> None:
        """Nothing to check locally: the gateway is the judge."""


class GatewayClientError(Exception):
    """Base of everything ``GatewayClient`` raises."""


class GatewayUnreachable(GatewayClientError):
    """No answer from the gateway: it could not be reached, the connection was
    cut, or it was too slow. The effect may or may not have been sent: repeat
    it with the same idempotency key (it is then replayed, or in progress)."""


class GatewayProblem(GatewayClientError):
    """The gateway answered with a problem document; ``code`` names it."""

    def __init__(self, status: int, document: dict[str, Any], headers: dict[str, str]) -> None:
        self.status = status
        self.document = document
        self.code: str = document.get("code", "unknown")
        self.detail: str = document.get("detail", "")
        self.headers = headers
        super().__init__(f"{status} {self.code}: {self.detail}")

    @property
    def retry_after(self) -> float | None:
        """Seconds the gateway asks to wait before trying again (its
        ``Retry-After``), or None when it set none."""
        value = self.headers.get(RETRY_AFTER)
        return float(value) if value else None


class FenceRejected(GatewayProblem):
    """412: the lease this effect was sent under no longer authorises it
    (``code``: ``stale_fence``, ``lease_expired``, ``no_lease``,
    ``invalid_fence``). Nothing was sent. Stop: this worker is a zombie."""

    @property
    def current_fence(self) -> int | None:
        """The resource's current fence (``stale_fence`` only)."""
        return self.document.get("current_fence")


class EffectInProgress(GatewayProblem):
    """409: an attempt of this key is in flight now; repeat the key after
    ``retry_after`` to get its answer."""


class EffectOutcomeUnknown(GatewayProblem):
    """409: an earlier attempt of this key may or may not have reached the
    provider. The gateway will not send it again: an operator resolves it
    (``fencegate effects resolve``, or the console)."""


class IdempotencyKeyReused(GatewayProblem):
    """422: the key was used before with a different request (or under
    another resource). Choose a new key for a new effect."""


class ProviderRejected(GatewayProblem):
    """422: the provider refused the email for good (a final SMTP answer).
    The refusal is stored: repeating the key replays it."""


class RateLimited(GatewayProblem):
    """429: the provider's configured rate, or its own 429, would be
    exceeded. Nothing was sent; wait ``retry_after`` and repeat the key."""


class ProviderError(GatewayProblem):
    """502: the provider failed in a way that is safe to retry; the key is
    free again. Repeat it."""


class ProviderOutcomeUnknown(GatewayProblem):
    """502: the provider failed after it may have acted; the key is not
    free. Repeats answer ``EffectOutcomeUnknown`` until an operator resolves it."""


class Unavailable(GatewayProblem):
    """503: the gateway cannot reach its database: it failed closed and
    nothing was sent. Repeat the key later."""


class Overloaded(GatewayProblem):
    """503: the gateway could not take the request in time; nothing was
    sent. Repeat the key after ``retry_after``."""


class ProviderTimeout(GatewayProblem):
    """504: the provider did not answer in time; the effect's outcome is
    unknown unless the provider dedupes on the gateway's key (then the
    gateway retries it itself within the provider's window)."""


_BY_CODE: dict[str, type[GatewayProblem]] = {
    "stale_fence": FenceRejected, "lease_expired": FenceRejected, "no_lease": FenceRejected,
    "invalid_fence": FenceRejected, "effect_in_progress": EffectInProgress,
    "effect_outcome_unknown": EffectOutcomeUnknown,
    "idempotency_key_reused": IdempotencyKeyReused, "provider_rejected": ProviderRejected,
    "rate_limited": RateLimited, "provider_error": ProviderError,
    "provider_outcome_unknown": ProviderOutcomeUnknown, "unavailable": Unavailable,
    "overloaded": Overloaded, "provider_timeout": ProviderTimeout,
}


@dataclass(frozen=True)
class Result:
    """A provider's answer to an effect (or the replay of it)."""

    status: int
    headers: dict[str, str]
    body: bytes
    replayed: bool

    def json(self) -> Any:
        """The body as JSON (raises ``ValueError`` when it is not JSON)."""
        return jsonlib.loads(self.body)


class GatewayClient:
    """Sends effects through the gateway at ``base_url`` with ``api_key``.

    Each call fills in ``Fence-Resource``, ``Fence-Token`` and
    ``Idempotency-Key`` from the lease and the key, calls ``lease.check()``
    first (a lease known lost attempts nothing), and raises one exception per
    problem code (see the module's tree). Use it as an async context manager,
    or call ``close``. ``session``: an aiohttp session of your own, which
    ``close`` then leaves open. ``timeout_seconds``: the whole request,
    answer included; past it ``GatewayUnreachable`` is raised.
    """

    def __init__(self, base_url: str, api_key: str, *,
                 session: aiohttp.ClientSession | None = None,
                 timeout_seconds: float = 60.0) -> None:
        self.base_url = base_url.rstrip("/")
        self._auth = {"Authorization": f"Bearer {api_key}"}
        self._session = session
        self._own_session = session is None
        self._timeout = aiohttp.ClientTimeout(total=timeout_seconds)

    async def __aenter__(self) -> GatewayClient:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the session this client made (not one it was given)."""
        if self._own_session and self._session is not None:
            await self._session.close()
            self._session = None

    def _sess(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=self._timeout)
        return self._session

    async def _send(self, lease: FencedLease, key: str, method: str, path: str,
                    **kwargs: Any) -> Result:
        lease.check()  # a lost lease attempts nothing
        headers = {**kwargs.pop("headers", {}), **self._auth,
                   FENCE_RESOURCE: lease.resource, FENCE_TOKEN: str(lease.fence),
                   IDEMPOTENCY_KEY: key}
        try:
            async with self._sess().request(method, self.base_url + path, headers=headers,
                                            allow_redirects=False, **kwargs) as resp:
                body = await resp.read()
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise GatewayUnreachable(f"no answer from the gateway ({type(exc).__name__}): "
                                     f"repeat the key {key!r} to learn what happened") \
                from exc
        hdrs = dict(resp.headers)
        code = resp.headers.get(PROBLEM_HEADER)
        if code is not None:
            try:
                doc = jsonlib.loads(body)
            except ValueError:
                doc = {"code": code, "detail": body[:200].decode(errors="replace")}
            raise _BY_CODE.get(code, GatewayProblem)(resp.status, doc, hdrs)
        return Result(resp.status, hdrs, body, resp.headers.get(IDEMPOTENT_REPLAYED) == "true")

    async def send_email(self, lease: FencedLease, idempotency_key: str, *, sender: str,
                         to: list[str], subject: str, text: str | None = None,
                         html: str | None = None, cc: list[str] | None = None,
                         bcc: list[str] | None = None, reply_to: str | None = None,
                         headers: dict[str, str] | None = None,
                         provider: str | None = None,
                         attachments: list[dict[str, str]] | None = None) -> Result:
        """Send one email under ``lease``, named ``idempotency_key``.

        ``attachments``: ``{"filename", "content" (base64), "content_type"?}``.
        ``provider`` picks one of the gateway's email providers (default: its
        only one). The answer's ``json()`` has ``status`` (``"sent"``),
        ``message_id`` and ``provider``; ``replayed`` is true when the gateway
        answered from its record of an earlier attempt and sent nothing.

        Raises:
            leases.LeaseLost: the lease is known lost here; nothing was sent.
            FenceRejected: the lease no longer authorises effects.
            GatewayProblem: a subclass per problem code (see the module).
            GatewayUnreachable: no answer; repeat the same key to learn what happened.
        """
        body: dict[str, Any] = {"from": sender, "to": to, "subject": subject}
        for name, value in (("text", text), ("html", html), ("cc", cc), ("bcc", bcc),
                            ("reply_to", reply_to), ("headers", headers),
                            ("provider", provider), ("attachments", attachments)):
            if value is not None:
                body[name] = value
        return await self._send(lease, idempotency_key, "POST", "/v1/email", json=body)

    async def request(self, lease: FencedLease, idempotency_key: str, provider: str,
                      method: str, path: str, *, json: Any = None, data: Any = None,
                      params: dict[str, str] | None = None,
                      headers: dict[str, str] | None = None) -> Result:
        """Forward one HTTP request to ``provider`` under ``lease``, named
        ``idempotency_key``, at ``path`` under the provider's base URL.

        ``data`` is bytes, or an async iterable of them (sent chunked). The
        provider's answer, whatever its status, is the ``Result``: only the
        gateway's own problems raise.

        Raises:
            leases.LeaseLost: the lease is known lost here; nothing was sent.
            FenceRejected: the lease no longer authorises effects.
            GatewayProblem: a subclass per problem code (see the module).
            GatewayUnreachable: no answer; repeat the same key to learn what happened.
        """
        kwargs: dict[str, Any] = {"headers": headers or {}}
        if json is not None:
            kwargs["json"] = json
        if data is not None:
            kwargs["data"] = data
        if params:
            kwargs["params"] = params
        return await self._send(lease, idempotency_key, method.upper(),
                                f"/v1/http/{provider}/{path.lstrip('/')}", **kwargs)
