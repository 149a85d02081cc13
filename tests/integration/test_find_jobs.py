"""Finding jobs on a real PostgreSQL: every filter, keyset pages, and input
that stays data however it is written."""

from __future__ import annotations

import datetime as dt

import asyncpg
import pytest

from leases import LeaseClient, NewJob, Queue
from leases.search import BadFilter, JobFilter, PayloadCondition, find_jobs, parse_payload


async def _ids(client: LeaseClient, where: JobFilter) -> list[int]:
    return [j["id"] for j in (await find_jobs(client, where, limit=1000)).jobs]


async def test_each_filter_finds_exactly_its_jobs(pool: asyncpg.Pool) -> None:
    client = LeaseClient(pool=pool)
    charges, mail = Queue(client, "charges"), Queue(client, "mail")
    a = await charges.enqueue({"customer": {"id": 42}, "amount": 1000}, dedupe_key="charge-a",
                              ordering_key="acct-7")
    b = await charges.enqueue({"customer": {"id": 43}, "amount": 1000}, ordering_key="acct-7")
    c = await mail.enqueue({"customer": {"id": 42}, "to": "x@example.com"},
                           dedupe_key="acct-7")
    later = await mail.enqueue({"customer": {"id": "42"}},
                               run_at=dt.datetime.now(dt.UTC) + dt.timedelta(hours=1))
    [claimed] = await charges.claim(limit=1)
    assert claimed.id == a

    assert await _ids(client, JobFilter()) == [later, c, b, a], "newest first"
    assert await _ids(client, JobFilter(queue="charges")) == [b, a]
    assert await _ids(client, JobFilter(states=("claimed",))) == [a]
    assert await _ids(client, JobFilter(states=("queued",))) == [later, c, b]
    assert await _ids(client, JobFilter(states=("scheduled",))) == [later]
    assert await _ids(client, JobFilter(states=("claimed", "scheduled"))) == [later, a]
    assert await _ids(client, JobFilter(dedupe_key="charge-a")) == [a]
    assert await _ids(client, JobFilter(ordering_key="acct-7")) == [b, a]
    assert await _ids(client, JobFilter(key="acct-7")) == [c, b, a], "either key"
    by_customer = JobFilter(payload=(parse_payload("customer.id=42"),))
    assert await _ids(client, by_customer) == [c, a], "a number is not the string \"42\""
    assert await _ids(client, JobFilter(payload=(parse_payload('customer.id="42"'),))) \
        == [later]
    assert await _ids(client, JobFilter(queue="charges", payload=(
        parse_payload("customer.id=42"), parse_payload("amount=1000")))) == [a]
    assert await _ids(client, JobFilter(payload=(parse_payload("no.such.field=1"),))) == []


async def test_the_time_range_is_on_the_time_named(pool: asyncpg.Pool) -> None:
    client = LeaseClient(pool=pool)
    q = Queue(client, "t")
    old, new = await q.enqueue({}), await q.enqueue({})
    await pool.execute("UPDATE fencegate_jobs SET created_at = '2026-01-01T00:00:00Z', "
                       "run_at = '2026-06-01T00:00:00Z' WHERE id = $1", old)
    jan, feb = (dt.datetime(2026, m, 1, tzinfo=dt.UTC) for m in (1, 2))
    assert await _ids(client, JobFilter(since=jan, until=feb)) == [old]
    assert await _ids(client, JobFilter(since=feb)) == [new]
    assert await _ids(client, JobFilter(until=jan)) == [], "until is exclusive"
    assert await _ids(client, JobFilter(since=feb, time_field="run_at")) == [new, old]
    assert await _ids(client, JobFilter(since=jan, time_field="finished")) == []


async def test_pages_neither_repeat_nor_skip_a_job_while_jobs_arrive(pool: asyncpg.Pool) -> None:
    client = LeaseClient(pool=pool)
    q = Queue(client, "pages")
    first = await q.enqueue_many([NewJob({"n": n}) for n in range(10)])
    seen: list[int] = []
    after: int | None = None
    while True:
        page = await find_jobs(client, JobFilter(queue="pages"), after=after, limit=3)
        seen += [j["id"] for j in page.jobs]
        await q.enqueue({"arrived": "between pages"})  # newer: on no later page
        if page.after is None:
            break
        after = page.after
    assert seen == sorted(first, reverse=True)


async def test_filters_are_data_never_sql(pool: asyncpg.Pool) -> None:
    client = LeaseClient(pool=pool)
    job = await Queue(client, "q").enqueue({"a'); DROP TABLE fencegate_jobs; --": 1})
    hostile = "x' OR '1'='1"
    assert await _ids(client, JobFilter(dedupe_key=hostile)) == []
    assert await _ids(client, JobFilter(key=hostile)) == []
    assert await _ids(client, JobFilter(payload=(PayloadCondition((hostile,), hostile),))) == []
    assert await _ids(client, JobFilter(payload=(
        PayloadCondition(("a'); DROP TABLE fencegate_jobs; --",), 1),))) == [job]
    with pytest.raises(BadFilter, match="queue names"):
        JobFilter(queue=hostile)
    assert await pool.fetchval("SELECT count(*) FROM fencegate_jobs") == 1


async def test_an_unknown_state_is_refused_naming_the_states(pool: asyncpg.Pool) -> None:
    client = LeaseClient(pool=pool)
    with pytest.raises(BadFilter) as refused:
        await find_jobs(client, JobFilter(states=("queued", "exploded")))
    assert "no job state 'exploded'" in str(refused.value)
    for state in ("queued", "claimed", "completed", "dead", "scheduled"):
        assert state in str(refused.value)
    with pytest.raises(BadFilter, match="limit"):
        await find_jobs(client, JobFilter(), limit=0)
