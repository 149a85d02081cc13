"""The operators' console on a real gateway and database: who gets in, what
each screen shows, the two actions and their protections (issue 13). The
same screens in a real browser: tests/browser/."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import asyncpg
import pytest

from gateway.console import session
from gateway.dev.sinks import SmtpSink, WebhookSink
from leases import LeaseClient, Queue
from tests.integration.conftest import API_KEY
from tests.support.console import OPERATOR_KEY, Console, open_console, unknown_effect
from tests.support.lapse import lapse


@pytest.fixture
async def console(dsn: str, pool: asyncpg.Pool, smtp_sink: SmtpSink,
                  webhook_sink: WebhookSink) -> AsyncIterator[Console]:
    async with open_console(dsn, pool, smtp_sink, webhook_sink) as c:
        yield c


async def test_only_operators_get_in_and_the_key_stays_out_of_urls(console: Console) -> None:
    status, _, _ = await console.page("/console/effects")
    assert status == 200  # the login page, after a redirect
    for key in ("not-a-key", API_KEY):  # unknown, and a worker's
        r = await console.login(key)
        assert r.status == 403
    r = await console.login()
    assert r.status == 303 and r.headers["Location"] == "/console"
    cookie = r.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie and "Path=/console" in cookie
    assert OPERATOR_KEY not in cookie
    status, html, headers = await console.page("/console/leases")
    assert status == 200 and "Leases" in html and OPERATOR_KEY not in html
    csp = headers["Content-Security-Policy"]
    assert "script-src 'self'" in csp and "default-src 'none'" in csp and "unsafe" not in csp
    # a login posted from another site is refused
    async with console.http.post(console.url + "/console/login", data={"api_key": OPERATOR_KEY},
                                 headers={"Origin": "https://evil.example"},
                                 allow_redirects=False) as r:
        assert r.status == 403


async def test_an_oversized_login_form_is_payload_too_large(console: Console) -> None:
    """aiohttp's own bound on a form read whole is the contract's 413, a
    problem document like every other answer."""
    async with console.http.post(console.url + "/console/login",
                                 data={"api_key": "k" * (70 * 1024)},
                                 headers={"Origin": console.url}, allow_redirects=False) as r:
        body = await r.json(content_type=None)
        assert (r.status, body["code"]) == (413, "payload_too_large")
        assert r.headers["Content-Type"].startswith("application/problem+json")


def test_sessions_are_signed_and_expire() -> None:
    secret = b"s" * 32
    s = session.Session("ops", "h", 2000, "n")
    sealed = session.seal(s, secret)
    assert session.unseal(sealed, secret, 1000) == s
    assert session.unseal(sealed, secret, 3000) is None  # expired
    assert session.unseal(sealed, b"t" * 32, 1000) is None  # another key
    _body, _, mac = sealed.partition(".")
    forged = session.seal(session.Session("admin", "h", 2000, "n"), b"t" * 32).split(".")[0]
    assert session.unseal(f"{forged}.{mac}", secret, 1000) is None


async def test_a_zombies_rejection_appears_with_its_resource(console: Console) -> None:
    await console.login()
    leases = LeaseClient(pool=console.pool)
    a = await leases.claim("run:zombie-1", ttl=30, owner="worker-a")
    assert a is not None
    await lapse(console.pool)  # a stalls past its ttl
    b = await leases.claim("run:zombie-1", ttl=30, owner="worker-b")
    assert b is not None
    async with console.http.post(console.url + "/v1/email", json={
            "from": "a@example.com", "to": ["b@example.com"], "subject": "s", "text": "t"},
            headers={"Authorization": f"Bearer {API_KEY}", "Fence-Resource": a.resource,
                     "Fence-Token": str(a.fence), "Idempotency-Key": "z1"}) as r:
        assert r.status == 412
    await console.gateway.rejections.flush()
    console.server.app[CACHE].forget()
    _, html, _ = await console.page("/console/rejections")
    zombies = html[html.index('id="zombies"'):]
    assert "run:zombie-1" in zombies and "stale_fence" in zombies and "agents" in zombies
    assert f"{a.fence:,}".replace(",", "\u202f") in zombies  # the zombie's fence
    assert 'class="bar stale_fence"' in html  # and a bar in the chart
    row = await console.pool.fetchrow("SELECT * FROM fencegate_rejections")
    assert (row["resource"], row["fence"], row["current_fence"], row["reason"]) == (
        a.resource, a.fence, b.fence, "stale_fence")


async def test_resolving_anunknown_effect(console: Console,
                                           caplog: pytest.LogCaptureFixture) -> None:
    await console.login()
    await unknown_effect(console.pool, "quote-7", past_deadline=True)
    await unknown_effect(console.pool, "quote-8", past_deadline=False)
    _, html, _ = await console.page("/console/effects")
    unknown = html[html.index('id="unknown"'):]
    assert "agents/quote-7" in unknown and "timed out during DATA" in unknown
    assert "resolvable in" in unknown  # quote-8: its deadline has not passed
    form = {"client": "agents", "key": "quote-7", "outcome": "sent", "confirm": "yes"}
    # no CSRF token, a wrong one, another origin: refused, nothing changes
    for data, origin in ((form, None), ({**form, "csrf": "x"}, None),
                         ({**form, "csrf": await console.csrf()}, "https://evil.example")):
        status, where = await console.post("/console/effects/resolve", data, origin)
        assert (status, where) == (303, "/console/effects?notice=refused")
    assert await console.pool.fetchval(
        "SELECT state FROM fencegate_effects WHERE idempotency_key = 'quote-7'") == "unknown"
    csrf = await console.csrf()
    with caplog.at_level(logging.INFO, logger="fencegate.console"):
        status, where = await console.post("/console/effects/resolve", {**form, "csrf": csrf})
    assert where == "/console/effect?client=agents&key=quote-7&notice=resolved_sent"
    assert await console.pool.fetchval(
        "SELECT state FROM fencegate_effects WHERE idempotency_key = 'quote-7'") == "succeeded"
    [record] = [r for r in caplog.records if getattr(r, "action", None) == "resolve"]
    assert record.operator == "ops" and record.key == "quote-7"  # type: ignore[attr-defined]
    _, where = await console.post("/console/effects/resolve", {
        "client": "agents", "key": "quote-8", "outcome": "not_sent", "confirm": "yes",
        "csrf": csrf})
    assert where == "/console/effect?client=agents&key=quote-8&notice=resolve_wait"
    _, html, _ = await console.page(where)
    assert "may still be under way" in html


async def test_replaying_a_dead_job(console: Console) -> None:
    await console.login()
    q = Queue(LeaseClient(pool=console.pool), "mail")
    job_id = await q.enqueue({"to": "lead@example.com"}, max_attempts=1)
    [job] = await q.claim()
    assert await q.fail(job, "SMTP 550 mailbox unavailable") == "dead"
    _, html, _ = await console.page("/console/queues")
    dead = html[html.index('id="jobs"'):]  # dead jobs: the table's default
    assert "SMTP 550 mailbox unavailable" in dead and "lead@example.com" in dead
    _status, where = await console.post("/console/jobs/replay", {
        "queue": "mail", "id": str(job_id), "confirm": "yes", "csrf": await console.csrf()})
    assert where == "/console/queues?notice=replayed"
    assert (await q.stats()) == {"queued": 1}
    _, html, _ = await console.page("/console/queues?part=1")
    assert html.lstrip().startswith("<h1>Queues</h1>")  # the refresh gets the main part only
    assert "<html" not in html


async def test_the_api_reference_is_served_from_the_package(console: Console) -> None:
    status, html, headers = await console.page("/docs")
    assert status == 200 and 'spec-url="/openapi.json"' in html
    assert '<script src="/console/static/redoc.standalone.js">' in html
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert "https:" not in html and "http:" not in html  # nothing from elsewhere
    async with console.http.get(console.url + "/console/static/redoc.standalone.js") as r:
        assert r.status == 200 and "javascript" in r.headers["Content-Type"]
        assert b"redoc.standalone.js.LICENSE.txt" in await r.read()
    async with console.http.get(console.url + "/console/static/redoc.standalone.js.LICENSE.txt"
                                ) as r:
        assert r.status == 200 and 'Version: "2.5' in await r.text()
    async with console.http.head(console.url + "/docs") as r:
        assert r.status == 200


CACHE = __import__("gateway.console", fromlist=["CACHE_KEY"]).CACHE_KEY


@pytest.mark.parametrize("client,key", [("agents", "k\x00"), ("ag\x00ents", "k")])
async def test_a_resolve_form_naming_no_possible_effect_says_so(
        console: Console, caplog: pytest.LogCaptureFixture, client: str, key: str) -> None:
    """The resolve form's client and key went to the database as typed: a NUL
    (PostgreSQL holds none in text) answered 500 with a traceback. A key no
    Idempotency-Key can be names no effect: the "no such effect" notice."""
    await console.login()
    csrf = await console.csrf()
    with caplog.at_level(logging.INFO):
        status, where = await console.post("/console/effects/resolve", {
            "client": client, "key": key, "outcome": "sent", "csrf": csrf})
    assert (status, where) == (303, "/console/effects?notice=no_such_effect")
    # nor does the effect's page of such a key fall over: not found
    async with console.http.get(console.url + "/console/effect", params={
            "client": client, "key": key}) as r:
        assert r.status == 404
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
