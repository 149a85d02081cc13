"""A batch of admissions (fencegate_admit_effects) whose keys are all new
takes a set-based path; a batch with a key already in the ledger undoes
that path's inserts and takes the loop of single admissions. Both must
answer the same, and leave the same ledger and the same drain barrier: one
batch is played on two copies of one scene, once as it is (set-based) and
once with one more entry, a repeat of a finished key, which sends the whole
batch through the loop."""

from __future__ import annotations

from typing import Any

import asyncpg

from gateway.ledger import Ledger, new_attempt
from leases import LeaseClient

ADMIT_BATCH = ("SELECT ord, verdict, current_fence, effect_id IS NOT NULL AS has_id, "
               "response_status FROM fencegate_admit_effects($1::text[], $2::text[], "
               "$3::bytea[], $4::text[], $5::bigint[], $6::text[], $7::bigint[], $8::float8[], "
               "$9::float8[], $10::float8, $11::jsonb[])")


async def _scene(pool: asyncpg.Pool, side: str) -> list[list[Any]]:
    """Leases on resources of ``side`` and the entries of a batch admitting
    new keys: two on one lease (one with a provider window), a stale fence,
    a fence from the future, an expired lease, no lease, a lease row another
    transaction holds (busy), an attempt the gateway abandoned."""
    fences = {}
    for r in ("one", "old", "held", "abandoned"):
        lease = await LeaseClient(pool=pool, owner="worker").claim(f"{side}:{r}", ttl=120)
        assert lease is not None
        fences[r] = lease.fence
    await pool.execute("UPDATE fencegate_leases SET expires_at = clock_timestamp() "
                       "- interval '1 second' WHERE resource = $1", f"{side}:old")
    abandoned = new_attempt()
    await pool.execute("INSERT INTO fencegate_abandoned_attempts (attempt) VALUES ($1)",
                       abandoned)
    entries: list[list[Any]] = []
    for key, r, fence, window, attempt in (
            ("a", "one", fences["one"], 0.0, new_attempt()),
            ("b", "one", fences["one"], 3600.0, new_attempt()),
            ("c", "one", fences["one"] - 1, 0.0, new_attempt()),
            ("d", "one", fences["one"] + 1, 0.0, new_attempt()),
            ("e", "old", fences["old"], 0.0, new_attempt()),
            ("f", "none", 7, 0.0, new_attempt()),
            ("g", "held", fences["held"], 0.0, new_attempt()),
            ("h", "abandoned", fences["abandoned"], 0.0, abandoned)):
        entries.append(["agents", f"{side}-{key}", key.encode(), f"{side}:{r}", fence, "hook",
                        attempt, 60.0 if key != "b" else 90.0, window,
                        '{"method": "POST"}' if key != "a" else None])
    return entries


async def _run(pool: asyncpg.Pool, entries: list[list[Any]], held: str) -> list[tuple[Any, ...]]:
    columns = [list(c) for c in zip(*entries, strict=True)]
    async with pool.acquire() as holder, holder.transaction():
        await holder.execute("SELECT 1 FROM fencegate_leases WHERE resource = $1 "
                             "FOR NO KEY UPDATE", held)
        rows = await pool.fetch(ADMIT_BATCH, *columns[:9], 30.0, columns[9])
    by_ord = {r["ord"]: r for r in rows}
    return [(by_ord[n + 1]["verdict"], by_ord[n + 1]["has_id"],
             by_ord[n + 1]["response_status"]) for n in range(len(entries))]


async def _state(pool: asyncpg.Pool, side: str) -> tuple[list[tuple[Any, ...]], ...]:
    effects = await pool.fetch(
        "SELECT substr(idempotency_key, length($1) + 2) AS key, state, fingerprint, provider, "
        "attempts, deadline - created_at, retry_until - created_at, updated_at = created_at, "
        "request_summary FROM fencegate_effects WHERE idempotency_key LIKE $1 || '-%' "
        "ORDER BY 1", side)
    leases = await pool.fetch(
        "SELECT substr(resource, length($1) + 2), inflight, "
        "drain_until - (SELECT max(deadline) FROM fencegate_effects WHERE resource = l.resource) "
        "FROM fencegate_leases l WHERE resource LIKE $1 || ':%' ORDER BY 1", side)
    return [tuple(r) for r in effects], [tuple(r) for r in leases]


async def test_set_based_batch_admits_as_the_loop_does(pool: asyncpg.Pool) -> None:
    fast = await _scene(pool, "fast")
    slow = await _scene(pool, "slow")
    # a finished key, repeated in the slow batch: a replay, and the loop
    lease = await LeaseClient(pool=pool, owner="worker").claim("slow:done", ttl=120)
    assert lease is not None
    ledger = Ledger(LeaseClient(pool=pool, owner="gateway", timeout=10))
    attempt = new_attempt()
    assert (await ledger.admit("agents", "slow-z", b"z", "slow:done", lease.fence, "hook",
                               attempt, 60.0, 0.0)).verdict == "admitted"
    await pool.fetchval("SELECT fencegate_finish_effect('agents', 'slow-z', $1, 'slow:done', "
                        "'succeeded', 200, '{}', 'ok', 'sent')", attempt)

    fast_done = await _run(pool, fast, "fast:held")
    slow_done = await _run(pool, [*slow, ["agents", "slow-z", b"z", "slow:done", lease.fence,
                                          "hook", new_attempt(), 60.0, 0.0, None]],
                           "slow:held")

    assert [v for v, _, _ in fast_done] == [
        "admitted", "admitted", "stale_fence", "invalid_fence", "lease_expired", "no_lease",
        "busy", "abandoned"]
    assert slow_done == [*fast_done, ("replay", True, 200)]
    fast_effects, fast_leases = await _state(pool, "fast")
    slow_effects, slow_leases = await _state(pool, "slow")
    assert fast_effects == [e for e in slow_effects if e[0] != "z"]
    assert [e[0] for e in fast_effects] == ["a", "b"]
    assert fast_leases == [x for x in slow_leases if x[0] != "done"]
    # both admissions counted in the barrier, which reaches the later deadline
    assert dict((x[0], x[1]) for x in fast_leases)["one"] == 2
    assert [x[2] for x in fast_leases if x[0] == "one"] == [__import__("datetime").timedelta(0)]


async def test_a_batch_with_one_key_twice_admits_it_once(pool: asyncpg.Pool) -> None:
    """Two admissions of one key in one batch take the loop: the first, in
    order, is admitted; the second finds it in progress."""
    lease = await LeaseClient(pool=pool, owner="worker").claim("run:t", ttl=120)
    assert lease is not None
    entry = ["agents", "twice", b"t", "run:t", lease.fence, "hook", 0, 60.0, 0.0, None]
    first, second = list(entry), list(entry)
    first[6], second[6] = new_attempt(), new_attempt()
    done = await _run(pool, [first, second], "run:nothing-held")
    assert done == [("admitted", True, None), ("effect_in_progress", True, None)]
    assert await pool.fetchval("SELECT inflight FROM fencegate_leases "
                               "WHERE resource = 'run:t'") == 1
