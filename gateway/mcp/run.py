"""One run's lease, held over the gateway's lease API (``/v1/leases/...``) and
kept renewed in the background, with the lease client's rules
(``leases.policy.RenewalPolicy``): renew every third of the ttl; trust the
lease only until a local deadline a margin before the server-side expiry,
measured from when the last successful claim or renewal was *sent*, on the
clock that counts suspend (``leases.clock``). A refused renewal, or a deadline
passed without one, loses the run for good.

A ``Run`` is a ``gateway.client.FencedLease``: ``GatewayClient`` calls its
``check()`` before sending, so a run known lost here sends nothing.
"""

from __future__ import annotations

import asyncio
from typing import Any, Final

import aiohttp

from gateway.client import GatewayUnreachable
from gateway.wire import PROBLEM_HEADER
from leases import clock
from leases.policy import RenewalPolicy

#: a run the session gave up itself
RELEASED: Final = "run_released"


class RunLost(Exception):
    """The run is not (or no longer) this session's; ``reason`` says why:
    ``stale_fence`` (another owner claimed it), ``lease_expired`` (it ran out
    before a renewal could prove ownership), or ``run_released``."""

    def __init__(self, reason: str, detail: str = "") -> None:
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


class LeaseApiProblem(Exception):
    """The lease API refused (its problem ``code``) or failed."""

    def __init__(self, status: int, code: str, detail: str) -> None:
        self.status, self.code, self.detail = status, code, detail
        super().__init__(f"{code}: {detail}")


class LeaseApi:
    """The gateway's lease routes, for one API key."""

    def __init__(self, session: aiohttp.ClientSession, base_url: str, api_key: str) -> None:
        self._session = session
        self._base = base_url.rstrip("/")
        self._auth = {"Authorization": f"Bearer {api_key}"}

    async def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        try:
            async with self._session.request(method, self._base + path, json=body,
                                             headers=self._auth,
                                             allow_redirects=False) as resp:
                status, problem = resp.status, resp.headers.get(PROBLEM_HEADER)
                try:
                    doc = await resp.json(content_type=None)
                except ValueError:
                    doc = None
        except (TimeoutError, aiohttp.ClientError) as exc:
            raise GatewayUnreachable(f"no answer from the gateway ({type(exc).__name__})") \
                from exc
        if problem is not None or status >= 400:
            doc = doc if isinstance(doc, dict) else {}
            raise LeaseApiProblem(status, str(doc.get("code", problem or "unknown")),
                                  str(doc.get("detail", "")))
        return status, doc

    async def claim(self, resource: str, ttl: float) -> dict[str, Any] | None:
        """The lease (``resource``, ``owner``, ``fence``, ``expires_at``), or
        None when another owner holds it (``lease_held``)."""
        try:
            _, doc = await self._call("POST", "/v1/leases/claim",
                                      {"resource": resource, "ttl_seconds": ttl})
        except LeaseApiProblem as exc:
            if exc.code == "lease_held":
                return None
            raise
        return dict(doc)

    async def renew(self, resource: str, owner: str, fence: int,
                    ttl: float) -> dict[str, Any] | None:
        """The renewed lease, or None when it is lost (``lease_lost``)."""
        try:
            _, doc = await self._call("POST", "/v1/leases/renew", {
                "resource": resource, "owner": owner, "fence": fence, "ttl_seconds": ttl})
        except LeaseApiProblem as exc:
            if exc.code == "lease_lost":
                return None
            raise
        return dict(doc)

    async def release(self, resource: str, owner: str, fence: int) -> bool:
        _, doc = await self._call("POST", "/v1/leases/release",
                                  {"resource": resource, "owner": owner, "fence": fence})
        return bool(doc.get("released"))

    async def show(self, resource: str) -> dict[str, Any]:
        _, doc = await self._call("GET", f"/v1/leases/{resource}")
        return dict(doc)


class Run:
    """A claimed run: ``resource``, ``fence``, ``owner``; renewed until it is
    released or lost. Make one with ``Run.claim``."""

    def __init__(self, api: LeaseApi, lease: dict[str, Any], ttl: float, sent_at: float) -> None:
        self._api = api
        self.resource: str = lease["resource"]
        self.owner: str = lease["owner"]
        self.fence: int = int(lease["fence"])
        self.expires_at: str = lease["expires_at"]
        self.ttl = ttl
        self.policy = RenewalPolicy(ttl)
        self.deadline = self.policy.deadline(sent_at)
        self._lost: RunLost | None = None
        self._released = False
        #: set after each renewal pass (a test waits on it instead of sleeping)
        self.renewed = asyncio.Event()
        self._task = asyncio.create_task(self._keep(self.policy.next_renewal(sent_at)),
                                         name=f"renew {self.resource}")

    @classmethod
    async def claim(cls, api: LeaseApi, resource: str, ttl: float) -> Run | None:
        """The run, claimed and renewing, or None when another owner holds it."""
        sent_at = clock.now()
        lease = await api.claim(resource, ttl)
        return None if lease is None else cls(api, lease, ttl, sent_at)

    @property
    def lost(self) -> RunLost | None:
        """Why the run is not this session's any more, or None while held."""
        if self._lost is None and clock.now() >= self.deadline:
            self._lose(RunLost("lease_expired", "the lease could not be renewed in time"))
        return self._lost

    def check(self) -> None:
        """Raise ``RunLost`` unless the run is still held by the local deadline."""
        if self.lost is not None:
            raise self.lost

    def seconds_left(self) -> float:
        """Seconds until the local deadline (0 once lost)."""
        return 0.0 if self.lost is not None else max(0.0, self.deadline - clock.now())

    def lose(self, reason: str, detail: str = "") -> None:
        """Mark the run lost (the gateway refused its fence): renewal stops."""
        self._lose(RunLost(reason, detail))

    def _lose(self, lost: RunLost) -> None:
        if self._lost is None:  # the first reason stays the reason
            self._lost = lost
        if self._task is not asyncio.current_task():
            self._task.cancel()

    async def release(self) -> bool:
        """Stop renewing and give the lease up; true when the gateway still
        had it live under this owner and fence (a lost run answers false)."""
        if self._released:
            return False
        self._released = True
        self._lose(RunLost(RELEASED, "this session released the run"))
        await asyncio.wait([self._task])  # the renewal has stopped (our own cancel propagates)
        try:
            return await self._api.release(self.resource, self.owner, self.fence)
        except (GatewayUnreachable, LeaseApiProblem):
            return False  # it expires by itself

    async def _keep(self, next_at: float) -> None:
        while True:
            await asyncio.sleep(max(0.0, next_at - clock.now()))
            sent = clock.now()
            if sent >= self.deadline:
                self._lose(RunLost("lease_expired", "the lease could not be renewed in time"))
                return
            try:
                async with asyncio.timeout(self.deadline - sent):
                    lease = await self._api.renew(self.resource, self.owner, self.fence,
                                                  self.ttl)
            except (TimeoutError, GatewayUnreachable, LeaseApiProblem):
                next_at = self.policy.retry_at(clock.now(), self.deadline)
                continue
            finally:
                self.renewed.set()
            if lease is None:
                self._lose(await self._why_lost())
                return
            self.deadline = self.policy.deadline(sent)
            self.expires_at = lease["expires_at"]
            next_at = self.policy.next_renewal(sent)

    async def _why_lost(self) -> RunLost:
        try:
            shown = await self._api.show(self.resource)
        except (GatewayUnreachable, LeaseApiProblem):
            shown = {}
        fence = shown.get("fence")
        if isinstance(fence, int) and fence > self.fence:
            return RunLost("stale_fence", "another owner claimed the run")
        return RunLost("lease_expired", "the renewal was refused: the lease had ended")
