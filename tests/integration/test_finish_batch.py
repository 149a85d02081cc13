"""A batch of attempt ends (fencegate_finish_effects) made only of successes
and failures takes a set-based path; any other batch takes the loop of
single ends. Both must answer the same, and leave the same ledger and the
same drain barrier: the same batch is played on two copies of one scene,
once as it is (set-based) and once with one more entry, an unknown end of a
key of its own, which sends it through the loop."""

from __future__ import annotations

from typing import Any

import asyncpg

from gateway.ledger import Ledger, new_attempt
from leases import LeaseClient

FINISH_BATCH = ("SELECT ord, done FROM fencegate_finish_effects($1::text[], $2::text[], "
                "$3::bigint[], $4::text[], $5::text[], $6::int[], $7::jsonb[], $8::bytea[], "
                "$9::text[])")


async def _scene(pool: asyncpg.Pool, ledger: Ledger, side: str) -> list[list[Any]]:
    """Leases and admitted attempts on resources of ``side``; the entries of a
    batch ending them: two ends on one lease, a failure, an end under a nonce
    that is not the attempt's (gone), an end of an attempt marked unknown
    once its deadline passed (recorded), and an end on a lease row another
    transaction holds (busy)."""
    fences = {}
    for r in ("one", "two", "held"):
        lease = await LeaseClient(pool=pool, owner="worker").claim(f"{side}:{r}", ttl=120)
        assert lease is not None
        fences[r] = lease.fence
    entries: list[list[Any]] = []
    for key, r, state, status, right_nonce in (
            ("a", "one", "succeeded", 200, True), ("b", "one", "failed", 422, True),
            ("c", "two", "succeeded", 200, False), ("d", "two", "succeeded", 201, True),
            ("e", "held", "succeeded", 200, True)):
        attempt = new_attempt()
        admission = await ledger.admit("agents", f"{side}-{key}", key.encode(),
                                       f"{side}:{r}", fences[r], "hook", attempt, 60.0, 0.0)
        assert admission.verdict == "admitted"
        entries.append(["agents", f"{side}-{key}", attempt if right_nonce else attempt + 1,
                        f"{side}:{r}", state, status, '{"h": "v"}', key.encode(), f"s-{key}"])
    await pool.execute("UPDATE fencegate_effects SET state = 'unknown' "
                       "WHERE idempotency_key = $1", f"{side}-d")
    return entries


async def _run(pool: asyncpg.Pool, entries: list[list[Any]], held: str) -> list[str]:
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT 1 FROM fencegate_leases WHERE resource = $1 "
                             "FOR NO KEY UPDATE", held)
        rows = await pool.fetch(FINISH_BATCH, *(list(c) for c in zip(*entries, strict=True)))
    by_ord = {r["ord"]: r["done"] for r in rows}
    return [by_ord[n + 1] for n in range(len(entries))]


async def _state(pool: asyncpg.Pool, side: str) -> tuple[list[tuple[Any, ...]], ...]:
    effects = await pool.fetch(
        "SELECT substr(idempotency_key, length($1) + 2) AS key, state, response_status, "
        "response_headers, response_body, summary, attempt IS NULL AS ended "
        "FROM fencegate_effects WHERE resource LIKE $1 || ':%' ORDER BY 1", side)
    leases = await pool.fetch(
        "SELECT substr(resource, length($1) + 2), inflight FROM fencegate_leases "
        "WHERE resource LIKE $1 || ':%' ORDER BY 1", side)
    return [tuple(r) for r in effects], [tuple(r) for r in leases]


async def test_set_based_batch_ends_as_the_loop_does(pool: asyncpg.Pool) -> None:
    ledger = Ledger(LeaseClient(pool=pool, owner="gateway", timeout=10))
    fast = await _scene(pool, ledger, "fast")
    slow = await _scene(pool, ledger, "slow")
    extra = new_attempt()
    lease = await LeaseClient(pool=pool, owner="worker").claim("slow:extra", ttl=120)
    assert lease is not None
    admission = await ledger.admit("agents", "slow-z", b"z", "slow:extra", lease.fence,
                                   "hook", extra, 60.0, 0.0)
    assert admission.verdict == "admitted"

    fast_done = await _run(pool, fast, "fast:held")
    slow_done = await _run(pool, [*slow, ["agents", "slow-z", extra, "slow:extra", "unknown",
                                          None, None, None, "s-z"]], "slow:held")

    assert fast_done == ["succeeded", "failed", "gone", "succeeded", "busy"]
    assert slow_done == [*fast_done, "unknown"]
    fast_effects, fast_leases = await _state(pool, "fast")
    slow_effects, slow_leases = await _state(pool, "slow")
    assert fast_effects == [e for e in slow_effects if e[0] != "z"]
    assert fast_leases == [x for x in slow_leases if x[0] != "extra"]
    # the two ends on one lease both left its barrier; the gone one did not
    assert dict(fast_leases) == {"one": 0, "two": 1, "held": 1}


async def test_a_batch_with_one_key_twice_ends_it_once(pool: asyncpg.Pool) -> None:
    """Two ends of one key in one batch (a retried record) take the loop: the
    first, in order, records; the second finds the attempt over."""
    lease = await LeaseClient(pool=pool, owner="worker").claim("run:t", ttl=120)
    assert lease is not None
    ledger = Ledger(LeaseClient(pool=pool, owner="gateway", timeout=10))
    attempt = new_attempt()
    admission = await ledger.admit("agents", "twice", b"t", "run:t", lease.fence, "hook",
                                   attempt, 60.0, 0.0)
    assert admission.verdict == "admitted"
    entry = ["agents", "twice", attempt, "run:t", "succeeded", 200, "{}", b"ok", "s"]
    rows = await pool.fetch(FINISH_BATCH, *(list(c) for c in zip(entry, entry, strict=True)))
    assert sorted((r["ord"], r["done"]) for r in rows) == [(1, "succeeded"), (2, "gone")]
    assert await pool.fetchval("SELECT inflight FROM fencegate_leases "
                               "WHERE resource = 'run:t'") == 0


async def test_an_end_without_a_resource_is_recorded_beside_a_busy_one(
    pool: asyncpg.Pool,
) -> None:
    """An entry with no resource (NULL) in a batch that also holds a busy
    entry: the loop records it (its lease row is looked up by the effect's
    own resource), so the set-based path must too, not answer it gone and
    leave its attempt in flight, counted in the barrier. The same batch is
    played down both paths (an unknown end of a key of its own sends one
    through the loop)."""
    ledger = Ledger(LeaseClient(pool=pool, owner="gateway", timeout=10))
    done = {}
    for side, last in (("fast", "succeeded"), ("slow", "unknown")):
        fences = {}
        for r in ("one", "held"):
            lease = await LeaseClient(pool=pool, owner="worker").claim(f"{side}:{r}", ttl=120)
            assert lease is not None
            fences[r] = lease.fence
        attempts = {k: new_attempt() for k in ("a", "h", "z")}
        for key, r in (("a", "one"), ("h", "held"), ("z", "one")):
            admission = await ledger.admit("agents", f"{side}-{key}", key.encode(),
                                           f"{side}:{r}", fences[r], "hook", attempts[key],
                                           60.0, 0.0)
            assert admission.verdict == "admitted"
        entries = [
            ["agents", f"{side}-a", attempts["a"], None, "succeeded", 200, "{}", b"ok", "s"],
            ["agents", f"{side}-h", attempts["h"], f"{side}:held", "succeeded", 200, "{}",
             b"ok", "s"],
            ["agents", f"{side}-z", attempts["z"], f"{side}:one", last,
             200 if last == "succeeded" else None, None, None, "s"]]
        done[side] = await _run(pool, entries, f"{side}:held")
    assert done["slow"] == ["succeeded", "busy", "unknown"]
    assert done["fast"] == ["succeeded", "busy", "succeeded"]
    assert await pool.fetchval("SELECT state FROM fencegate_effects "
                               "WHERE idempotency_key = 'fast-a'") == "succeeded"
    # both ends on fast:one left its barrier
    assert await pool.fetchval("SELECT inflight FROM fencegate_leases "
                               "WHERE resource = 'fast:one'") == 0
