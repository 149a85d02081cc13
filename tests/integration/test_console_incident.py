"""The console as an operator resolving an incident uses it (issue 25): no
secret on any page, a page per effect with what the ledger keeps, findable
resolutions naming the operator, filters and pages on every list, a
confirmation before each action, legible times and messages."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator

import asyncpg
import pytest

from gateway.dev.sinks import SmtpSink, WebhookSink
from leases import LeaseClient, Queue
from tests.integration.conftest import API_KEY
from tests.support.console import OPERATOR_KEY, Console, open_console, unknown_effect


@pytest.fixture
async def console(dsn: str, pool: asyncpg.Pool, smtp_sink: SmtpSink,
                  webhook_sink: WebhookSink) -> AsyncIterator[Console]:
    async with open_console(dsn, pool, smtp_sink, webhook_sink) as c:
        yield c

SECRET = "sk_live_123"


async def test_a_dead_jobs_payload_and_error_show_no_secret(console: Console) -> None:
    await console.login()
    q = Queue(LeaseClient(pool=console.pool), "crm")
    await q.enqueue({"to": "lead@example.com", "api_key": SECRET,
                     "crm": {"auth": {"token": "t0ps3cret"}}}, max_attempts=1)
    [job] = await q.claim()
    assert await q.fail(job, f"RuntimeError: CRM refused (api_key={SECRET})") == "dead"
    _, html, _ = await console.page("/console/queues")
    dead = html[html.index('id="jobs"'):]  # dead jobs: the table's default
    assert SECRET not in html and "t0ps3cret" not in html
    assert "lead@example.com" in dead  # the rest of the payload is shown
    assert "CRM refused (api_key=***)" in dead  # the parenthesis is kept


async def _rejection(console: Console, resource: str, reason: str, key: str) -> None:
    await console.pool.execute(
        "INSERT INTO fencegate_rejections (client, provider, reason, resource, fence, "
        "current_fence, idempotency_key) VALUES ('agents', 'mail', $1, $2, 1, 2, $3)",
        reason, resource, key)


async def test_an_effect_has_a_page_with_what_the_ledger_keeps(console: Console) -> None:
    """Everything an operator needs before resolving: the effect's row (its
    attempts, times and the provider's answer), the resource's current lease
    and the rejections recorded on it; and a resolve form that needs a tick."""
    await console.login()
    await unknown_effect(console.pool, "quote-7", past_deadline=True)
    await _rejection(console, "run:u", "stale_fence", "zombie-key-1")
    status, html, _ = await console.page("/console/effect?client=agents&key=quote-7")
    assert status == 200
    for shown in ("quote-7", "run:u", "mail", "timed out during DATA", "zombie-key-1",
                  "stale_fence", 'id="lease"', 'id="attempts"', "kept no summary"):
        assert shown in html, shown
    form = html[html.index('action="/console/effects/resolve"'):]
    assert re.search(r'<input type="checkbox" name="confirm" value="yes" required', form)
    # the lists link to it
    _, listing, _ = await console.page("/console/effects")
    assert 'href="/console/effect?client=agents&amp;key=quote-7"' in listing
    status, html, _ = await console.page("/console/effect?client=agents&key=nope")
    assert status == 404 and "No effect" in html


async def test_resolving_needs_a_confirmation_and_names_the_operator(console: Console,
                                                                     ) -> None:
    """A resolve without the tick changes nothing; one with it is recorded
    with the operator's client name and time, and an effect resolved
    not_sent (its row deleted: the key is free) stays findable."""
    await console.login()
    await unknown_effect(console.pool, "quote-9", past_deadline=True)
    form = {"client": "agents", "key": "quote-9", "outcome": "not_sent",
            "csrf": await console.csrf()}
    _, where = await console.post("/console/effects/resolve", form)
    assert where == "/console/effect?client=agents&key=quote-9&notice=confirm"
    assert await console.pool.fetchval(
        "SELECT state FROM fencegate_effects WHERE idempotency_key = 'quote-9'") == "unknown"
    _, where = await console.post("/console/effects/resolve", {**form, "confirm": "yes"})
    assert where == "/console/effect?client=agents&key=quote-9&notice=resolved_not_sent"
    assert await console.pool.fetchval(
        "SELECT count(*) FROM fencegate_effects WHERE idempotency_key = 'quote-9'") == 0
    row = await console.pool.fetchrow(
        "SELECT * FROM fencegate_resolutions WHERE idempotency_key = 'quote-9'")
    assert (row["client"], row["outcome"], row["operator"], row["resource"]) == (
        "agents", "not_sent", "ops", "run:u")
    assert row["resolved_at"] is not None and row["summary"] == "timed out during DATA"
    status, html, _ = await console.page(where)
    assert status == 200 and "resolved as not sent" in html and "ops" in html
    _, listing, _ = await console.page("/console/effects")
    resolved = listing[listing.index('id="resolved"'):]
    assert "quote-9" in resolved and "ops" in resolved


async def test_replaying_needs_a_confirmation(console: Console) -> None:
    await console.login()
    q = Queue(LeaseClient(pool=console.pool), "mail")
    job_id = await q.enqueue({"to": "lead@example.com"}, max_attempts=1)
    [job] = await q.claim()
    assert await q.fail(job, "SMTP 550") == "dead"
    _, html, _ = await console.page("/console/queues")
    assert re.search(r'<input type="checkbox" name="confirm" value="yes" required', html)
    form = {"queue": "mail", "id": str(job_id), "csrf": await console.csrf()}
    _, where = await console.post("/console/jobs/replay", form)
    assert where == "/console/queues?notice=confirm"
    assert (await q.stats()) == {"dead": 1}
    _, where = await console.post("/console/jobs/replay", {**form, "confirm": "yes"})
    assert where == "/console/queues?notice=replayed"


async def test_a_post_without_origin_is_refused(console: Console) -> None:
    """docs/console.md: every action must come from the console's own origin.
    A POST that names none (no Origin, no Sec-Fetch-Site) is not trusted."""
    await console.login()
    await unknown_effect(console.pool, "quote-10", past_deadline=True)
    form = {"client": "agents", "key": "quote-10", "outcome": "sent", "confirm": "yes",
            "csrf": await console.csrf()}
    async with console.http.post(console.url + "/console/effects/resolve", data=form,
                                 allow_redirects=False) as r:
        assert "Origin" not in r.request_info.headers
        assert r.headers["Location"] == "/console/effects?notice=refused"
    assert await console.pool.fetchval(
        "SELECT state FROM fencegate_effects WHERE idempotency_key = 'quote-10'") == "unknown"
    async with console.http.post(console.url + "/console/login", data={
            "api_key": OPERATOR_KEY}, allow_redirects=False) as r:
        assert r.status == 403


async def test_zombies_are_told_apart_from_other_refusals(console: Console) -> None:
    """Under "Where the zombies were": only stale_fence and lease_expired (a
    worker acting under a lease it lost), with the refused request's key;
    no_lease and invalid_fence (no claim ever issued that fence) apart."""
    await console.login()
    await _rejection(console, "run:z", "stale_fence", "zombie-key-1")
    await _rejection(console, "run:never", "no_lease", "stray-key-2")
    await _rejection(console, "run:forged", "invalid_fence", "stray-key-3")
    _, html, _ = await console.page("/console/rejections")
    zombies = html[html.index('id="zombies"'):html.index("</table>", html.index('id="zombies"'))]
    assert "run:z" in zombies and "zombie-key-1" in zombies
    assert "run:never" not in zombies and "run:forged" not in zombies
    others = html[html.index('id="other-refusals"'):]
    assert "run:never" in others and "stray-key-2" in others and "run:forged" in others


async def test_the_chart_scale_is_a_caption_not_a_title(console: Console) -> None:
    await console.login()
    await _rejection(console, "run:z", "stale_fence", "zombie-key-1")
    _, html, _ = await console.page("/console/rejections")
    svg = html[html.index("<svg"):html.index("</svg>")]
    assert "per minute</text>" not in svg
    caption = html[html.index("<figcaption"):html.index("</figcaption>")]
    assert "rejections per minute" in caption and "tallest bar: 1" in caption


async def test_every_time_is_written_one_way(console: Console) -> None:
    """UTC, RFC 3339 (leases/formats.py) on every table, and in the header's
    "updated" time that the page's script writes."""
    async with console.http.get(console.url + "/console/static/console.js") as r:
        script = await r.text()
    assert "toLocale" not in script and "toISOString" in script
    await console.login()
    await unknown_effect(console.pool, "quote-11", past_deadline=True)
    _, html, _ = await console.page("/console/effect?client=agents&key=quote-11")
    assert re.search(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", html)
    assert " PM" not in html and " AM" not in html


async def test_login_errors_say_what_is_wrong_and_not_whose_key(console: Console) -> None:
    """A refused key gets one answer whether it is unknown or a worker's (the
    page tells nothing about which keys exist), and it says what to check;
    an empty or broken paste is named as such."""
    async def error(key: str) -> tuple[int, str]:
        async with console.http.post(console.url + "/console/login", data={"api_key": key},
                                     headers={"Origin": console.url}) as r:
            html = await r.text()
        found = re.search(r'<p class="error" role="alert">(.*?)</p>', html, re.S)
        assert found is not None
        return r.status, " ".join(found.group(1).split())

    unknown, worker = await error(OPERATOR_KEY + "x"), await error(API_KEY)
    assert unknown == worker and unknown[0] == 403
    assert "Not an operator's API key" not in unknown[1]
    assert "typo" in unknown[1] and "operator" in unknown[1]
    status, empty = await error("")
    assert status == 400 and "Paste" in empty
    status, broken = await error("test-key\nope rator")
    assert status == 400 and "space or line break" in broken


async def _effect(console: Console, key: str, resource: str, provider: str, state: str,
                  ) -> None:
    await console.pool.execute(
        "INSERT INTO fencegate_effects (client, idempotency_key, fingerprint, resource, fence, "
        "provider, state, deadline, response_status, summary) VALUES ('agents', $1, "
        "'\\x00'::bytea, $2, 1, $3, $4, clock_timestamp(), 200, 'done')",
        key, resource, provider, state)


def _section(html: str, id_: str) -> str:
    start = html.index(f'id="{id_}"')
    return html[start:html.index("</table>", start)]


async def test_effects_are_searched_filtered_and_paged(console: Console) -> None:
    await console.login()
    await _effect(console, "alpha-1", "run:a", "mail", "succeeded")
    await _effect(console, "alpha-2", "run:b", "hooks", "failed")
    await _effect(console, "beta-1", "run:b", "hooks", "succeeded")

    async def found(query: str) -> str:
        status, html, _ = await console.page("/console/effects?" + query)
        assert status == 200
        return _section(html, "found")

    both = await found("key=alpha")
    assert "alpha-1" in both and "alpha-2" in both and "beta-1" not in both
    assert "beta-1" in await found("resource=run:b&provider=hooks&state=succeeded")
    assert "alpha-2" not in await found("resource=run:b&provider=hooks&state=succeeded")
    assert "alpha" not in await found("since=2999-01-01T00:00:00Z")
    assert "alpha-1" in await found("until=2999-01-01T00:00:00Z&provider=mail")
    first = await found("per=2")
    assert "beta-1" in first and "alpha-2" in first and "alpha-1" not in first
    _, html, _ = await console.page("/console/effects?per=2")
    assert 'href="/console/effects?per=2&amp;page=2"' in html  # the next page, kept filtered
    assert "alpha-1" in await found("per=2&page=2")
    status, html, _ = await console.page("/console/effects?since=yesterday")
    assert status == 400 and "since" in html


async def test_leases_live_or_ended(console: Console) -> None:
    await console.login()
    await console.pool.execute("""
        INSERT INTO fencegate_leases (resource, owner, fence, claimed_at, expires_at) VALUES
          ('run:alive', 'w', 1, clock_timestamp(), clock_timestamp() + interval '1 hour'),
          ('run:gone', 'w', 1, clock_timestamp() - interval '2 days',
           clock_timestamp() - interval '1 day')""")
    _, html, _ = await console.page("/console/leases?status=ended")
    assert "run:gone" in html and "run:alive" not in html  # ended a day ago: still found
    _, html, _ = await console.page("/console/leases?status=live")
    assert "run:alive" in html and "run:gone" not in html
    _, html, _ = await console.page("/console/leases?resource=run:g")
    assert "run:gone" in html and "run:alive" not in html


async def test_jobs_by_state_and_queue(console: Console) -> None:
    await console.login()
    db = LeaseClient(pool=console.pool)
    await Queue(db, "mail").enqueue({"to": "m@example.com"})
    await Queue(db, "crm").enqueue({"to": "c@example.com"})
    _, html, _ = await console.page("/console/queues?state=queued&queue=mail")
    jobs = _section(html, "jobs")
    assert "m@example.com" in jobs and "c@example.com" not in jobs
    _, html, _ = await console.page("/console/queues?state=queued")
    jobs = _section(html, "jobs")
    assert "m@example.com" in jobs and "c@example.com" in jobs


async def test_an_effects_stored_answer_shows_no_secret(console: Console) -> None:
    """The provider's stored answer (headers and body) is shown on the
    effect's page through the same redaction as payloads."""
    await console.login()
    await _effect(console, "crm-1", "lead:1", "crm", "succeeded")
    await console.pool.execute(
        "UPDATE fencegate_effects SET response_headers = $1::jsonb, response_body = $2 "
        "WHERE idempotency_key = 'crm-1'",
        '{"Set-Cookie": "sid=s3ss10n", "Content-Type": "application/json"}',
        b'{"id": "c_9", "access_token": "t0ps3cret", "owner": {"password": "hunter2"}}')
    status, html, _ = await console.page("/console/effect?client=agents&key=crm-1")
    assert status == 200
    for secret in ("s3ss10n", "t0ps3cret", "hunter2"):
        assert secret not in html
    assert "c_9" in html and "application/json" in html
