"""The aiohttp application: routes from the table, one small middleware, and the
pool's and providers' lifecycles in ``cleanup_ctx``."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from gateway import console
from gateway.api import parserlog
from gateway.api.auth import Authenticator
from gateway.api.problems import Problem
from gateway.api.request import CLIENT, gw_of
from gateway.api.routes import ROUTES, Handler, Route
from gateway.config import Config, SmtpProviderConfig
from gateway.effects import slots
from gateway.ledger import Ledger
from gateway.metrics import (
    DB_UNAVAILABLE,
    HTTP_DURATION,
    REQUESTS_REFUSED,
    method_label,
    start_at_zero,
    status_label,
)
from gateway.providers import HttpProvider, Provider, SmtpProvider
from gateway.state import GATEWAY, Gateway
from gateway.wire import IDEMPOTENCY_KEY, RETRY_AFTER
from leases import Busy, LeaseClient, Unavailable, database, migrate
from leases.metrics import AWAITING_PURGE
from leases.observe import QueueCollector

log = logging.getLogger("fencegate.gateway")

ROUTE_KEY = web.AppKey("routes", dict)
PURGE_INTERVAL_SECONDS = 600.0
#: the longest a request waits for a free database connection
POOL_WAIT_SECONDS = 1.0


def _route_of(request: web.Request) -> Route | None:
    info = request.match_info.route
    routes: dict[object, Route] = request.app[ROUTE_KEY]
    return routes.get(info)


@web.middleware
async def front(request: web.Request, handler: Handler) -> web.StreamResponse:
    """What every request passes through, as one layer (four nested
    middlewares cost a coroutine each, on every request): its duration
    measured; the limit on API requests at once; the caller authenticated;
    every error made a problem document. Every answer to an effect echoes
    its key."""
    started = time.perf_counter()
    route = _route_of(request)
    status = 500
    try:
        response = await _answered(request, handler, route)
        status = response.status
        if route is not None and route.effect:
            key = request.headers.get(IDEMPOTENCY_KEY, "")
            if key and key.isascii() and key.isprintable() and len(key) <= 255:
                response.headers[IDEMPOTENCY_KEY] = key
        return response
    finally:
        _duration(route.openapi_path if route else "unmatched", request.method,
                  status).observe(time.perf_counter() - started)


@functools.lru_cache(maxsize=1024)
def _duration(route: str, method: str, status: int) -> Any:
    """The series of one answer; every label from a bounded set (the route's
    pattern or "unmatched", a known method or "other", a status code)."""
    return HTTP_DURATION.labels(route=route, method=method_label(method),
                                status=status_label(status))


def _unanswered(request: web.Request) -> str:
    """What an Unavailable means for this route: nothing reached a provider,
    but a change of a lease may still have been carried out."""
    if request.method == "POST" and request.path.startswith("/v1/leases/"):
        return ("the database gave no answer in time; the change may still have been "
                "carried out (a claim without an owner is abandoned): check the lease")
    return "the database cannot be reached; nothing was sent"


async def _answered(request: web.Request, handler: Handler,
                    route: Route | None) -> web.StreamResponse:
    """Every error becomes a problem document; nothing internal reaches the caller."""
    try:
        if route is None and request.method == "POST":  # a console form: bounded alike
            return await _bounded(request, handler, None)
        if route is None or not route.auth:  # health, readiness, metrics: never refused
            return await handler(request)
        return await _bounded(request, handler, route)
    except Problem as p:
        return p.response()
    except Unavailable as exc:  # the database gave no answer: fail closed, here only
        DB_UNAVAILABLE.inc()
        log.warning("database unreachable: %s", exc, extra={
            "path": request.path, "error": type(exc.__cause__).__name__})
        return Problem("unavailable", _unanswered(request), headers={RETRY_AFTER: "1"}).response()
    except Busy:  # every connection of this process's pool in use: overload, not an outage
        REQUESTS_REFUSED.labels(reason="database_pool").inc()
        return Problem("overloaded", "the gateway is overloaded (no database connection "
                       "came free in time); nothing was sent, retry later",
                       headers={RETRY_AFTER: "1"}).response()
    except web.HTTPNotFound:
        return Problem("not_found", "no such route").response()
    except web.HTTPMethodNotAllowed:
        return Problem("method_not_allowed", "method not allowed on this route").response()
    except web.HTTPRequestEntityTooLarge:  # aiohttp's own bound (a form read whole)
        return Problem("payload_too_large", f"the body is larger than "
                       f"{request.app[GATEWAY].config.server.max_body_bytes} bytes").response()
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        return Problem("bad_request", exc.reason or "bad request").response()
    except Exception as exc:
        log.error("unhandled error: %s", exc, extra={
            "path": request.path, "method": request.method, "error": type(exc).__name__},
            exc_info=True)
        return Problem("internal_error", "the gateway failed; nothing more is known to "
                       "the caller, the operator has the log").response()


async def _bounded(request: web.Request, handler: Handler,
                   route: Route | None) -> web.StreamResponse:
    """At most ``max_requests_in_flight`` requests at work at once in this
    process: past it, 503 overloaded at once, before anything is admitted,
    rather than queueing for seconds behind the others. An API caller is
    authenticated first. A request with a body takes its slot once the body
    has arrived (gateway/effects/slots.py): slow bodies do not hold the room
    others need; one without takes it now. ``route`` None: a console form."""
    if route is not None:
        request[CLIENT] = gw_of(request).auth.client(request.headers.get("Authorization"))
    request[slots.SLOT] = slots.Slot()
    try:
        if route is not None and not route.reads_body:
            slots.take(request)
        return await handler(request)
    finally:
        slots.release(request)


def make_providers(config: Config) -> dict[str, Provider]:
    out: dict[str, Provider] = {}
    for name, p in config.providers.items():
        out[name] = SmtpProvider(p) if isinstance(p, SmtpProviderConfig) else \
            HttpProvider(p, config.server.max_body_bytes)
    return out


def build_app(config: Config, dsn: str, *, migrate_on_start: bool = True,
              processes: int = 1) -> web.Application:
    """The gateway for ``config`` on the database at ``dsn``, as one of
    ``processes`` serving processes (each takes its share of the rate limits)."""
    parserlog.install()  # no caller's bytes (an API key) in aiohttp's own log
    app = web.Application(middlewares=[front],
                          client_max_size=config.server.max_body_bytes + 1)
    routes: dict[object, Route] = {}
    for r in ROUTES:
        routes[app.router.add_route(r.method, r.path, r.handler)] = r
    app[ROUTE_KEY] = routes

    async def lifecycle(app: web.Application) -> AsyncIterator[None]:
        if migrate_on_start:
            await migrate.migrate_dsn(dsn)
        db_timeout = config.server.database_timeout_seconds
        pool = await database.create_pool(
            dsn, min_size=2, max_size=config.database_pool_size,
            # no statement outlives the gateway's wait for it: an admission the
            # gateway gave up on has ended, one way or the other, soon after
            server_settings={"statement_timeout": str(int(db_timeout * 1000))},
            # bounds asyncpg's cancellation of a query we stopped waiting for:
            # without it, a connection whose answers are lost holds the request
            # (and the pool slot) for a minute
            command_timeout=db_timeout)
        # a connection that does not come free within a second means overload:
        # refuse (503 overloaded) rather than queue for the database timeout
        leases = LeaseClient(pool=pool, timeout=db_timeout,
                             acquire_timeout=min(db_timeout, POOL_WAIT_SECONDS))
        gw = Gateway(config=config, pool=pool, ledger=Ledger(leases), leases=leases,
                     auth=Authenticator(config.clients), providers=make_providers(config),
                     rate_share=1 / processes)
        gw.observer = QueueCollector(gw.leases, timeout=db_timeout)
        for provider in gw.providers.values():
            await provider.start()
        app[GATEWAY] = gw
        purger = asyncio.get_running_loop().create_task(_purge_loop(gw))
        try:
            yield
        finally:
            purger.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await purger
            await gw.ledger.drain()
            for provider in gw.providers.values():
                await provider.close()
            await pool.close()

    app.cleanup_ctx.append(lifecycle)
    console.mount(app)  # after lifecycle: its own start needs the Gateway
    start_at_zero(config.providers)
    return app


async def _purge_loop(gw: Gateway) -> None:
    """Drop finished effects past retention, in batches until caught up;
    in-flight and unknown ones stay. Never dies: a failed pass is logged and
    the next one tries again."""
    retention = gw.config.server.effect_retention_seconds
    while True:
        try:
            purged = await gw.ledger.purge(retention)
            await gw.ledger.purge_abandoned()
            AWAITING_PURGE.labels(table="effects").set(await gw.ledger.awaiting_purge(retention))
            if purged:
                log.info("purged finished effects", extra={"effects": purged})
        except Unavailable:
            log.warning("purge skipped: database unreachable")
        except Exception as exc:
            log.error("purge failed: %s", exc, extra={"error": type(exc).__name__},
                      exc_info=True)
        await asyncio.sleep(PURGE_INTERVAL_SECONDS)
