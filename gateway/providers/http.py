"""HTTP providers (webhooks, CRMs, payment APIs, email APIs) through aiohttp.

``/v1/http`` requests are forwarded as they came; ``POST /v1/email`` to a
provider with an email preset is mapped onto its API (email_apis/) and sent
through the same session, connections and write_guard.

Only the configured base URL is reachable: the caller's path is appended to it
(after ``requests.provider_path`` refused escapes), redirects are handed back,
never followed.

Every attempt is exactly one request on the wire: aiohttp's own silent retry
of PUT and DELETE on a lost keep-alive connection is turned off (a provider
that acted and then dropped the connection would act twice).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import replace

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest
from aiohttp.tracing import Trace
from yarl import URL

from gateway.api.bodies import read_limited
from gateway.config import HttpProviderConfig
from gateway.config.presets import DEFAULT_NOT_ACTED_STATUSES, DEFAULT_UNKNOWN_STATUSES
from gateway.effects import pace
from gateway.effects.deadline import Deadline
from gateway.effects.ratelimit import retry_after_header
from gateway.providers import http_email, sigv4, sockets, write_guard
from gateway.providers.base import (
    Call,
    EmailCall,
    HttpCall,
    Outcome,
    ProviderCall,
    problem_outcome,
    too_late,
)
from gateway.signing import (
    FENCE_SIGNATURE,
    WEBHOOK_ID,
    WEBHOOK_SIGNATURE,
    WEBHOOK_TIMESTAMP,
    fence_signature,
    webhook_signature,
)
from gateway.wire import (
    FENCE_RESOURCE,
    FENCE_TOKEN,
    RETRY_AFTER,
    TRUNCATED,
    AttemptEnd,
    ProblemCode,
    header_text,
)

#: the provider's answer headers handed back (content headers)
KEPT_RESPONSE_HEADERS = ("Content-Type", "Content-Language", "Content-Disposition", "ETag",
                         "Last-Modified", "Location", "Cache-Control")
#: provider statuses that mean "failed, nothing done, try again" (a preset
#: may add those its provider documents: ``config.not_acted_statuses``)
RETRYABLE_STATUSES = DEFAULT_NOT_ACTED_STATUSES
#: statuses that may come after the provider acted: a load balancer's 504
#: (the backend too slow) or 502 (the backend dropped the connection after
#: taking the request), a 500 after part of the work committed. The outcome
#: is unknown. Even where the provider dedupes on our key the key is not
#: freed: the effect stays unknown and is resent only while the provider's
#: window, counted from the first attempt, still covers the resend.
AMBIGUOUS_STATUSES = DEFAULT_UNKNOWN_STATUSES
KEEPALIVE_SECONDS = 4.0


def _failure(e: BaseException) -> Outcome:
    """The outcome of a request that got no answer."""
    if isinstance(e, aiohttp.ClientConnectorError):
        return problem_outcome("free", "provider_error",
                               f"cannot connect to the provider: {type(e).__name__}; "
                               "nothing was sent", "http connect failed")
    if isinstance(e, TimeoutError):
        return problem_outcome("unknown", "provider_timeout",
                               "the provider did not answer in time; the request may have "
                               "reached it", "http timeout")
    return problem_outcome("unknown", "provider_timeout",
                           f"the connection to the provider was lost ({type(e).__name__}); "
                           "the request may have reached it", "http connection lost")


class _GatedConnector(aiohttp.TCPConnector):
    """Connections whose every write passes the attempt's gate (write_guard.py),
    which reset rather than close (sockets.py)."""

    #: the provider's timeout, the bound on unacknowledged data (sockets.py)
    timeout_seconds = 30.0

    async def _create_connection(self, req: ClientRequest, traces: list[Trace],
                                 timeout: aiohttp.ClientTimeout) -> ResponseHandler:
        proto = await super()._create_connection(req, traces, timeout)
        if proto.transport is not None:
            try:
                sockets.prepare(proto.transport.get_extra_info("socket"), self.timeout_seconds)
            except BaseException:
                proto.abort()
                raise
            proto.transport = write_guard.GatedTransport(proto.transport)  # type: ignore[assignment]
        return proto


class HttpProvider:
    def __init__(self, config: HttpProviderConfig, max_body_bytes: int) -> None:
        self.config = config
        self.max_body_bytes = max_body_bytes
        self._session: aiohttp.ClientSession | None = None

    async def start(self) -> None:
        connector = _GatedConnector(limit=256, keepalive_timeout=KEEPALIVE_SECONDS)
        connector.timeout_seconds = self.config.timeout_seconds
        self._session = aiohttp.ClientSession(
            connector=connector, timeout=aiohttp.ClientTimeout(total=None),
            auto_decompress=True, cookie_jar=aiohttp.DummyCookieJar(),
        )
        # aiohttp resends GET, PUT and DELETE once when a reused connection
        # fails; it has no public switch for it (aio-libs/aiohttp#10790) and
        # its own test client turns it off the same way. tests/ checks every
        # method against a provider that acts and then drops the connection.
        if not hasattr(self._session, "_retry_connection"):
            raise RuntimeError("this aiohttp cannot turn off its request retry")
        self._session._retry_connection = False

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    def url(self, path: str, query: str) -> URL:
        """The provider's URL for a path and a query as the caller sent them
        (both still percent-encoded: neither is encoded again)."""
        return URL(f"{self.config.base_url}/{path}" + (f"?{query}" if query else ""),
                   encoded=True)

    def own_headers(self, call: Call, body: bytes) -> dict[str, str]:
        """What the gateway puts on every request to this provider: the fence,
        the provider's authentication, the derived key under the provider's
        idempotency header, and a Standard Webhooks signature of ``body`` with
        the fence signature beside it (gateway/signing.py: the Standard one
        does not cover the fence headers a receiver keeps)."""
        headers = {FENCE_RESOURCE: call.resource, FENCE_TOKEN: str(call.fence)}
        headers.update(self.config.auth_headers)
        if self.config.idempotency_header:
            headers[self.config.idempotency_header] = call.derived_key
        if self.config.signing_secret:
            ts = int(time.time())
            secret, msg_id = self.config.signing_secret, call.derived_key
            headers[WEBHOOK_ID] = msg_id
            headers[WEBHOOK_TIMESTAMP] = str(ts)
            headers[WEBHOOK_SIGNATURE] = webhook_signature(secret, msg_id, ts, body)
            headers[FENCE_SIGNATURE] = fence_signature(secret, msg_id, ts, call.resource,
                                                       call.fence, body)
        return headers

    def headers(self, call: HttpCall) -> dict[str, str]:
        """The caller's headers, less every one the gateway sets (in any
        letter case: a dict keeps "x-key" beside "X-Key", and both would be
        sent), then the gateway's: replaced, never appended."""
        own = self.own_headers(call, call.body)
        owned = {name.lower() for name in own}
        headers = {k: v for k, v in call.forwarded.items()
                   if k.lower() not in owned}
        headers.update(own)
        return headers

    async def send(self, call: ProviderCall, deadline: Deadline) -> Outcome:
        assert self._session is not None, "provider not started"
        if not deadline.can_start():
            return too_late(self.config.name)
        if isinstance(call, EmailCall):
            return await self._send_email(call, deadline)
        url = self.url(call.path, call.query)
        return await self._exchange(call.method, url, self._signed(call.method, url,
                                                                   self.headers(call), call.body),
                                    call.body, deadline, self._outcome)

    def _signed(self, method: str, url: URL, headers: dict[str, str],
                body: bytes) -> dict[str, str]:
        """The headers, signed last (AWS SigV4) when the preset signs requests."""
        preset = self.config.preset
        if preset is None or preset.auth.scheme != "sigv4":
            return headers
        return sigv4.sign(self.config, method, str(url), headers, body)

    async def _send_email(self, call: EmailCall, deadline: Deadline) -> Outcome:
        """``POST /v1/email`` through the preset's email API (email_apis/)."""
        api = http_email.api_of(self.config)
        request = await api.build(call, self.config)
        url = self.url(request.path, "")
        headers = self._signed(request.method, url, {
            **request.headers, "Content-Type": request.content_type,
            **self.own_headers(call, request.body)}, request.body)

        def judge(resp: aiohttp.ClientResponse, body: bytes) -> Outcome:
            return http_email.judge(self.config, call, resp.status, resp.headers, body)

        return await self._exchange(request.method, url, headers, request.body, deadline, judge)

    async def _exchange(self, method: str, url: URL, headers: dict[str, str], body: bytes,
                        deadline: Deadline,
                        judge: Callable[[aiohttp.ClientResponse, bytes], Outcome]) -> Outcome:
        """One request on the wire, every write through the attempt's write_guard."""
        assert self._session is not None, "provider not started"
        writes = write_guard.WriteGate(deadline)
        data: bytes | AsyncIterator[bytes] | None = body or None
        if len(body) > write_guard.CHUNK_BYTES:  # in pieces, each through the gate; not chunked
            headers = {**headers, "Content-Length": str(len(body))}
            data = write_guard.pieces(body, writes)
        token = write_guard.CURRENT.set(writes)
        try:
            async with asyncio.timeout(deadline.bound(self.config.timeout_seconds)):
                async with self._session.request(
                    method, url, data=data, headers=headers, allow_redirects=False,
                ) as resp:
                    answer = await read_limited(resp.content, self.max_body_bytes)
                    outcome = judge(resp, answer)
                    if resp.status == 429:
                        return self._paced(outcome, resp.headers)
                    return outcome
        except (write_guard.GateClosed, aiohttp.ClientError, TimeoutError) as e:
            if writes.closed and writes.written == 0:  # nothing of it left
                return too_late(self.config.name, "the request to be written")
            outcome = problem_outcome(
                "unknown", "provider_timeout", "the request was cut at the attempt's "
                "deadline after part of it was sent; its outcome is unknown",
                "http cut at the deadline") if writes.closed else _failure(e)
            if outcome.kind != "unknown":
                return outcome
            # the connection is reset by now (write_guard.py): whatever asyncio still
            # held was dropped with it, and decides whether "not sent" is safe
            return replace(outcome, request_never_whole=writes.never_whole())
        finally:
            writes.end()
            write_guard.CURRENT.reset(token)

    def _paced(self, outcome: Outcome, headers: Mapping[str, str]) -> Outcome:
        """A 429: how long the provider asks every caller to wait, by what its
        preset says it sends, on the outcome and in its ``Retry-After``."""
        seconds = pace.requested_pause(headers, self.config.pace, time.time())
        return replace(outcome, pause_seconds=seconds,
                       headers={**outcome.headers, RETRY_AFTER: retry_after_header(seconds)})

    def _outcome(self, resp: aiohttp.ClientResponse, body: bytes) -> Outcome:
        # as text both the caller's answer and its stored replay carry alike
        headers = {h: header_text(resp.headers[h]) for h in KEPT_RESPONSE_HEADERS
                   if h in resp.headers}
        if len(body) > self.max_body_bytes:
            body = body[: self.max_body_bytes]
            headers[TRUNCATED] = "true"
        if resp.status in self.config.not_acted_statuses:
            return problem_outcome("free", "provider_error",
                                   f"the provider answered {resp.status}; the key is free again",
                                   f"http {resp.status}", provider_status=resp.status)
        if resp.status in self.config.unknown_statuses:
            code: ProblemCode = "provider_timeout" if resp.status == 504 \
                else "provider_outcome_unknown"
            return problem_outcome("unknown", code,
                                   f"the provider answered {resp.status}, which may come after "
                                   "it acted: the outcome is unknown",
                                   f"http {resp.status}", provider_status=resp.status)
        kind: AttemptEnd = "failed" if resp.status >= 400 else "succeeded"
        return Outcome(kind, resp.status, body, headers, f"http {resp.status}")
