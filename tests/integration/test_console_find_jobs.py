"""Finding jobs on the console's queues screen: the filters of `jobs find`,
keyset pages, and a bad filter answered 400 saying why."""

from __future__ import annotations

import html as htmllib
import re
from collections.abc import AsyncIterator
from urllib.parse import urlencode

import asyncpg
import pytest

from gateway.dev.sinks import SmtpSink, WebhookSink
from leases import LeaseClient, NewJob, Queue
from tests.support.console import Console, open_console


@pytest.fixture
async def console(dsn: str, pool: asyncpg.Pool, smtp_sink: SmtpSink,
                  webhook_sink: WebhookSink) -> AsyncIterator[Console]:
    async with open_console(dsn, pool, smtp_sink, webhook_sink) as c:
        yield c


def _job_ids(html: str) -> list[int]:
    table = html[html.index('id="jobs"'):]
    table = table[:table.index("</table>")]
    return [int(n) for n in re.findall(r"<tr><td>(\d+)</td>", table)]


async def test_jobs_are_found_by_key_payload_and_state(console: Console) -> None:
    await console.login()
    q = Queue(LeaseClient(pool=console.pool), "charges")
    a = await q.enqueue({"customer": {"id": 42}}, dedupe_key="charge-a")
    b = await q.enqueue({"customer": {"id": 43}}, ordering_key="acct-9")
    await Queue(LeaseClient(pool=console.pool), "mail").enqueue({"customer": {"id": 42}})

    async def ids(**query: str) -> list[int]:
        status, html, _ = await console.page(f"/console/queues?{urlencode(query)}")
        assert status == 200, html
        return _job_ids(html)

    assert await ids(state="queued", queue="charges", payload="customer.id=42") == [a]
    assert await ids(state="any", key="charge-a") == [a]
    assert await ids(state="any", key="acct-9") == [b]
    assert await ids(state="queued", since="1h") == [a + 2, b, a]
    assert await ids(state="queued", until="1h") == []
    assert await ids() == [], "dead jobs by default: none here"


async def test_the_older_link_pages_on_from_the_last_job_shown(console: Console) -> None:
    await console.login()
    ids = await Queue(LeaseClient(pool=console.pool), "bulk").enqueue_many(
        [NewJob({"n": n}) for n in range(5)])
    status, html, _ = await console.page("/console/queues?state=queued&per=2")
    assert status == 200 and _job_ids(html) == ids[::-1][:2]
    seen = _job_ids(html)
    while (older := re.search(r'<a href="([^"]+)">older →</a>', html)) is not None:
        status, html, _ = await console.page(htmllib.unescape(older.group(1)))
        assert status == 200
        assert "← newest" in html
        seen += _job_ids(html)
    assert seen == ids[::-1]


@pytest.mark.parametrize(("query", "says"), [
    ({"state": "exploded"}, "state: one of queued, claimed, completed, dead"),
    ({"payload": "customer.id"}, "FIELD.PATH=VALUE"),
    ({"payload": "auth.password=hunter2"}, "looks like a secret"),
    ({"since": "yesterday"}, "an age like 15m"),
    ({"after": "-3"}, "after: a whole number"),
    ({"per": "100000"}, "per: a whole number from 1 to 200"),
    ({"queue": "no such queue!"}, "queue names"),
])
async def test_a_bad_filter_is_answered_400_saying_why(console: Console, query: dict[str, str],
                                                      says: str) -> None:
    await console.login()
    status, html, _ = await console.page(f"/console/queues?{urlencode(query)}")
    assert status == 400
    assert "That filter cannot be read" in html and htmllib.escape(says) in html, html
