"""The operators' console: server-rendered pages under ``/console`` (leases,
effects and a page per effect, fence rejections, queues; each list filtered
and paged), a little JavaScript that refreshes them in place, and two
actions, each confirmed (resolve an unknown effect, replay a dead job).
Also ``/docs``, the API reference of ``/openapi.json`` (Redoc, vendored).

These are HTML routes for people, kept apart from the JSON API's route table
(gateway/api/routes.py): they add nothing to ``/openapi.json``. ``mount`` adds them
to the gateway's application, with the fence-rejection recorder the
rejections screen reads (gateway/effects/rejections.py).

Security: see session.py (operators only, signed HttpOnly SameSite=Strict
cookie, CSRF token and origin check on every action); every page is sent
with a strict Content-Security-Policy (no inline script or style, nothing
loaded from elsewhere); every login and action is logged with the operator's
name (logger ``fencegate.console``).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from importlib import resources
from typing import Any
from urllib.parse import parse_qsl, urlencode

import aiohttp_jinja2
import jinja2
from aiohttp import web

from gateway.api import parsing
from gateway.api.bodies import receive
from gateway.config import ClientConfig
from gateway.console import screens, session
from gateway.console.throttle import THROTTLE_KEY, LoginThrottle
from gateway.effects import slots
from gateway.effects.ratelimit import retry_after_header
from gateway.effects.rejections import RejectionLog
from gateway.state import GATEWAY, Gateway
from gateway.wire import RETRY_AFTER
from leases import Queue, Unavailable, formats

log = logging.getLogger("fencegate.console")

CACHE_KEY = web.AppKey("console_cache", screens.Cache)
#: the largest console form read: a login (an API key) or an action (a CSRF
#: token, a client, a key of at most 255 characters, an outcome) is a few
#: hundred bytes, percent-encoded; the forms take no key, so nothing more is read
FORM_MAX_BYTES = 4096
SCREENS: dict[str, Callable[..., Awaitable[dict[str, Any]]]] = {
    "leases": screens.leases, "effects": screens.effects,
    "rejections": screens.rejections, "queues": screens.queues,
}
TITLES = {"leases": "Leases", "effects": "Effects", "rejections": "Fence rejections",
          "queues": "Queues"}

CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
       "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'")
#: Redoc draws with styles it injects, and searches in a worker made from a blob
DOCS_CSP = ("default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline'; "
            "img-src 'self' data:; font-src 'self' data:; connect-src 'self'; "
            "worker-src blob:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'")
STATIC = {"console.css": "text/css", "console.js": "text/javascript",
          "redoc.standalone.js": "text/javascript",
          "redoc.standalone.js.LICENSE.txt": "text/plain", "redoc.LICENSE": "text/plain"}

NOTICES = {
    "resolved_sent": "Resolved as sent: the effect is stored as succeeded; repeats of its "
                     "key are replayed, nothing is sent again.",
    "resolved_not_sent": "Resolved as not sent: the key is free again; the worker's next "
                         "attempt with it is sent.",
    "resolve_wait": "Not yet: an attempt of that effect may still be under way, or its "
                    "whole request may still sit at the provider, which may yet act on it "
                    "(then \"not sent\" waits ten minutes past its deadline; \"sent\" "
                    "does not). Try again later.",
    "not_unknown": "That effect is not awaiting resolution any more.",
    "no_such_effect": "No such effect.",
    "replayed": "Replayed: the job is back in its queue, its attempts reset.",
    "not_dead": "That job is not dead any more.",
    "confirm": "Nothing was done: tick the confirmation box first.",
    "refused": "That action was refused (an expired page?): reload and try again.",
}


#: one answer for an unknown key and for a key of a client that is no operator:
#: the page must not tell which keys exist
LOGIN_REFUSED = ("That key does not open the console. Check it for a typo (keys are "
                 "case-sensitive; paste the whole key), and that it is the key of a client "
                 'with role = "operator" in the gateway\'s configuration: other clients\' '
                 "keys are refused too.")


def _misformed_key(api_key: str) -> str | None:
    """What is wrong with a pasted key, from its text alone; None if nothing."""
    if not api_key:
        return "Paste your operator's API key in the field, then log in."
    if any(c.isspace() for c in api_key):
        return ("The key has a space or line break in it: API keys have none. "
                "Paste it again, in one piece.")
    if not api_key.isprintable():
        return "The key has a character that cannot be typed in it: paste it again."
    return None


def _secured(response: web.StreamResponse, csp: str = CSP) -> web.StreamResponse:
    response.headers["Content-Security-Policy"] = csp
    response.headers["X-Content-Type-Options"] = "nosniff"
    # not no-referrer: with it, browsers send "Origin: null" on the forms' POSTs
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers["X-Frame-Options"] = "DENY"
    response.headers.setdefault("Cache-Control", "no-store")
    return response


def _gw(request: web.Request) -> Gateway:
    return request.app[GATEWAY]


def _render(name: str, request: web.Request, context: dict[str, Any],
            status: int = 200) -> web.StreamResponse:
    return _secured(aiohttp_jinja2.render_template(name, request, context, status=status))


async def _form(request: web.Request) -> dict[str, str]:
    """A console form (``application/x-www-form-urlencoded``), read as the
    API reads a body: within ``FORM_MAX_BYTES`` and ``body_timeout_seconds``
    (413, 408), then the request takes its slot like any other
    (gateway/effects/slots.py). Never ``request.post()``: that reads up to
    ``max_body_bytes`` with no deadline."""
    timeout = _gw(request).config.server.body_timeout_seconds
    raw = await receive(request, FORM_MAX_BYTES, timeout)
    slots.take(request)
    try:
        return dict(parse_qsl(raw.decode(), keep_blank_values=True))
    except UnicodeDecodeError:
        raise parsing.bad("body", "must be a UTF-8 form") from None


def _operator(request: web.Request) -> tuple[session.Session, ClientConfig]:
    found = session.current(request, _gw(request).config)
    if found is None:  # the page's refresh follows this too, and then reloads
        raise web.HTTPSeeOther("/console/login")
    return found


# ---- login ----------------------------------------------------------------------------

async def login_page(request: web.Request) -> web.StreamResponse:
    if session.current(request, _gw(request).config) is not None:
        raise web.HTTPSeeOther("/console")
    return _render("login.html", request, {"error": None})


async def login(request: web.Request) -> web.StreamResponse:
    if not session.same_origin(request):
        return _render("login.html", request, {"error": NOTICES["refused"]}, status=403)
    form = await _form(request)
    throttle = request.app[THROTTLE_KEY]
    source, now = request.remote or "", throttle.clock()
    wait = throttle.wait(source, now)
    if wait > 0:  # the key is not looked at: a right one is refused too
        log.warning("console login throttled", extra={
            "peer": source, "retry_after_seconds": round(wait, 1)})
        refused = _render("login.html", request, {
            "error": "Too many failed logins: try again later."}, status=429)
        refused.headers[RETRY_AFTER] = retry_after_header(wait)
        return refused
    api_key = str(form.get("api_key", "")).strip()
    misformed = _misformed_key(api_key)
    if misformed:  # said from the text alone: tells nothing about which keys exist
        log.warning("console login refused: no key, or a broken paste", extra={"peer": source})
        return _render("login.html", request, {"error": misformed}, status=400)
    client = session.operator_for_key(_gw(request).config, api_key)
    if client is None:
        failures = throttle.failed(source, now)
        log.warning("console login refused", extra={"peer": source, "failures": failures})
        return _render("login.html", request, {"error": LOGIN_REFUSED}, status=403)
    throttle.succeeded(source)
    response = web.HTTPSeeOther("/console")
    session.start(response, request, client, api_key)
    log.info("operator %s logged in to the console", client.name,
             extra={"operator": client.name, "action": "login", "peer": request.remote})
    _secured(response)
    raise response


async def logout(request: web.Request) -> web.StreamResponse:
    found = session.current(request, _gw(request).config)
    response = web.HTTPSeeOther("/console/login")
    form = await _form(request)
    if found is not None and session.same_origin(request) and session.csrf_ok(
            found[0], request.app[session.SECRET_KEY], str(form.get("csrf", ""))):
        session.end(response)
        log.info("operator %s logged out", found[1].name,
                 extra={"operator": found[1].name, "action": "logout"})
    raise response


# ---- screens --------------------------------------------------------------------------

async def home(request: web.Request) -> web.StreamResponse:
    _operator(request)
    raise web.HTTPSeeOther("/console/leases")


async def screen(request: web.Request) -> web.StreamResponse:
    name = request.match_info["screen"]
    if name not in SCREENS:
        raise web.HTTPNotFound()
    sess, operator = _operator(request)
    gw = _gw(request)
    context: dict[str, Any] = {
        "screen": name, "title": TITLES[name], "titles": TITLES, "operator": operator.name,
        "csrf": sess.csrf(request.app[session.SECRET_KEY]),
        "notice": NOTICES.get(request.query.get("notice", "")),
        "part": bool(request.query.get("part")), "error": None,
        "dropped": gw.rejections.dropped if gw.rejections else 0,
    }
    query = {k: v for k, v in request.query.items() if k not in ("notice", "part")}
    try:
        context.update(await request.app[CACHE_KEY].get(
            f"{name}?{urlencode(sorted(query.items()))}",
            lambda: SCREENS[name](gw.leases, query)))
    except screens.BadFilter as e:
        context["error"] = f"That filter cannot be read: {e}."
        return _render(f"{name}.html", request, context, status=400)
    except Unavailable:
        context["error"] = "The database does not answer: what is shown may be out of date."
        return _render(f"{name}.html", request, context, status=503)
    return _render(f"{name}.html", request, context)


async def effect(request: web.Request) -> web.StreamResponse:
    """One effect's page: ``/console/effect?client=...&key=...`` (a key may
    hold any character, so it goes in the query, not the path)."""
    sess, operator = _operator(request)
    gw = _gw(request)
    client, key = request.query.get("client", ""), request.query.get("key", "")
    context: dict[str, Any] = {
        "screen": "effects", "title": f"Effect {key}", "titles": TITLES,
        "operator": operator.name, "csrf": sess.csrf(request.app[session.SECRET_KEY]),
        "notice": NOTICES.get(request.query.get("notice", "")),
        "part": bool(request.query.get("part")), "error": None,
    }
    try:
        context.update(await request.app[CACHE_KEY].get(
            "effect?" + urlencode({"client": client, "key": key}),
            lambda: screens.effect(gw.leases, client, key)))
    except Unavailable:
        context["error"] = "The database does not answer: what is shown may be out of date."
        return _render("effect.html", request, context, status=503)
    found = context["e"] is not None or context["resolutions"]
    return _render("effect.html", request, context, status=200 if found else 404)


def effect_url(client: str, key: str, notice: str | None = None) -> str:
    query = {"client": client, "key": key} | ({"notice": notice} if notice else {})
    return "/console/effect?" + urlencode(query)


# ---- actions --------------------------------------------------------------------------

async def _action(request: web.Request) -> tuple[ClientConfig, Any] | None:
    """The operator and the form of a POST that passed the origin and CSRF
    checks; None if it did not."""
    sess, operator = _operator(request)
    form = await _form(request)
    if not session.same_origin(request) or not session.csrf_ok(
            sess, request.app[session.SECRET_KEY], str(form.get("csrf", ""))):
        log.warning("console action refused: origin or CSRF token", extra={
            "operator": operator.name, "path": request.path})
        return None
    return operator, form


async def resolve(request: web.Request) -> web.StreamResponse:
    checked = await _action(request)
    if checked is None:
        raise web.HTTPSeeOther("/console/effects?notice=refused")
    operator, form = checked
    client, key, outcome = (str(form.get(k, "")) for k in ("client", "key", "outcome"))
    if outcome not in ("sent", "not_sent"):
        raise web.HTTPSeeOther("/console/effects?notice=refused")
    # a key no Idempotency-Key can be, or a NUL (PostgreSQL holds none in
    # text), names no effect: no page of it to go back to either
    if not parsing.is_key(key) or "\x00" in client:
        raise web.HTTPSeeOther("/console/effects?notice=no_such_effect")
    if form.get("confirm") != "yes":
        raise web.HTTPSeeOther(effect_url(client, key, "confirm"))
    gw = _gw(request)
    if await gw.ledger.resolve(client, key, outcome, operator=operator.name):
        notice = f"resolved_{outcome}"
    else:
        notice = {"not_found": "no_such_effect", "effect_in_progress": "resolve_wait",
                  "effect_not_unknown": "not_unknown"}[
            (await gw.ledger.why_unresolved(client, key, outcome)).code]
    request.app[CACHE_KEY].forget()
    log.info("operator %s resolved effect %s of client %s as %s: %s", operator.name, key,
             client, outcome, notice, extra={
                 "operator": operator.name, "action": "resolve", "client": client,
                 "key": key, "outcome": outcome, "result": notice})
    raise web.HTTPSeeOther(effect_url(client, key, notice))


async def replay(request: web.Request) -> web.StreamResponse:
    checked = await _action(request)
    if checked is None:
        raise web.HTTPSeeOther("/console/queues?notice=refused")
    operator, form = checked
    if form.get("confirm") != "yes":
        raise web.HTTPSeeOther("/console/queues?notice=confirm")
    try:
        queue = Queue(_gw(request).leases, str(form.get("queue", "")))
        job_id = int(str(form.get("id", "")))
    except ValueError:
        raise web.HTTPSeeOther("/console/queues?notice=refused") from None
    done = await queue.replay([job_id])
    notice = "replayed" if done else "not_dead"
    request.app[CACHE_KEY].forget()
    log.info("operator %s replayed dead job %s of queue %s: %s", operator.name, job_id,
             queue.name, notice, extra={"operator": operator.name, "action": "replay",
                                        "queue": queue.name, "job": job_id, "result": notice})
    raise web.HTTPSeeOther(f"/console/queues?notice={notice}")


# ---- files, and the API reference ------------------------------------------------------

async def static(request: web.Request) -> web.StreamResponse:
    name = request.match_info["name"]
    if name not in STATIC:
        raise web.HTTPNotFound()
    body = resources.files(__package__).joinpath("static", name).read_bytes()
    response = web.Response(body=body, content_type=STATIC[name])
    response.headers["Cache-Control"] = "public, max-age=3600"
    return _secured(response)


async def docs(request: web.Request) -> web.StreamResponse:
    """The API reference: Redoc (vendored, static/) drawing /openapi.json."""
    page = resources.files(__package__).joinpath("templates", "docs.html").read_text()
    return _secured(web.Response(text=page, content_type="text/html"), DOCS_CSP)


def _filters(env: jinja2.Environment) -> None:
    env.filters["ts"] = lambda v: formats.timestamp(v) if v is not None else ""
    env.filters["fence"] = lambda v: "" if v is None else f"{v:,}".replace(",", "\u202f")
    env.filters["seconds"] = lambda v: "" if v is None else (
        f"{v:.0f} s" if v < 120 else f"{v / 60:.0f} min" if v < 7200 else f"{v / 3600:.1f} h")
    env.filters["json"] = formats.text


def mount(app: web.Application) -> None:
    """Add the console, /docs and the rejection recorder to the gateway's app."""
    env = aiohttp_jinja2.setup(app, loader=jinja2.PackageLoader(__package__, "templates"),
                               autoescape=True, undefined=jinja2.StrictUndefined)
    _filters(env)
    app[session.SECRET_KEY] = session.secret_for_processes()
    app[CACHE_KEY] = screens.Cache()
    app[THROTTLE_KEY] = LoginThrottle()
    app.router.add_get("/console", home, allow_head=False)
    app.router.add_get("/console/login", login_page, allow_head=False)
    app.router.add_post("/console/login", login)
    app.router.add_post("/console/logout", logout)
    app.router.add_post("/console/effects/resolve", resolve)
    app.router.add_post("/console/jobs/replay", replay)
    app.router.add_get("/console/effect", effect, allow_head=False)
    app.router.add_get("/console/static/{name}", static, allow_head=False)
    app.router.add_get("/console/{screen}", screen, allow_head=False)
    app.router.add_get("/docs", docs)  # and HEAD
    app.cleanup_ctx.append(_recorder)


async def _recorder(app: web.Application) -> AsyncIterator[None]:
    gw = app[GATEWAY]
    gw.rejections = RejectionLog(gw.leases)
    gw.rejections.start()
    try:
        yield
    finally:
        await gw.rejections.stop()
