"""Group commit on the effect path and in the lease client (issue 11): what
goes together still obeys every rule one by one, and one held resource does
not hold the others."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

import asyncpg

from gateway.effects.fingerprint import derived_key
from leases import LeaseClient
from tests.integration.conftest import Gw
from tests.support.lapse import lapse


def _batches(statement: str) -> tuple[float, float]:
    """(statements, calls they carried) so far, in this process."""
    from prometheus_client import REGISTRY

    labels = {"statement": statement}
    return (REGISTRY.get_sample_value("fencegate_db_batch_size_count", labels) or 0.0,
            REGISTRY.get_sample_value("fencegate_db_batch_size_sum", labels) or 0.0)


async def test_a_batch_of_stale_and_current_fences_on_shared_resources(gw: Gw) -> None:
    """Sixty effects at once on four resources, a third of them under the
    fence a zombie still holds, some keys twice: the stale ones are refused,
    each current key is sent once, its duplicates told in progress."""
    client = LeaseClient(pool=gw.pool, owner="a")
    stale, current = {}, {}
    for r in range(4):
        old = await client.claim(f"run:g{r}", ttl=30)
        assert old is not None
        await lapse(gw.pool, old.resource)  # a zombie from now on
        new = await LeaseClient(pool=gw.pool, owner="b").claim(f"run:g{r}", ttl=60)
        assert new is not None and new.fence > old.fence
        stale[r], current[r] = old, new
    before = _batches("admit")
    calls = []
    for i in range(60):
        r = i % 4
        lease = stale[r] if i % 3 == 0 else current[r]
        key = f"g-{i % 40}"  # twenty keys asked twice
        calls.append((key, lease, gw.request("POST", "/v1/http/crm/x",
                                             gw.headers(lease, key), json={"k": key})))
    answers = await asyncio.gather(*(c for _, _, c in calls))
    outcomes = Counter()
    for (key, lease, _), (status, _, body) in zip(calls, answers, strict=True):
        code = body.get("code") if isinstance(body, dict) else None
        if lease in stale.values():
            assert (status, code) == (412, "stale_fence"), (key, status, body)
        else:
            assert status == 200 or code in ("effect_in_progress", "idempotency_key_reused"), \
                (key, status, body)
        outcomes[(status, code)] += 1
    sent = Counter(d.header("Idempotency-Key") for d in gw.hook.deliveries)
    assert all(n == 1 for n in sent.values()), sent
    # and they did go together: statements carried more than one admission
    after = _batches("admit")
    assert after[1] - before[1] > after[0] - before[0], (before, after)
    admitted_keys = {key for (key, lease, _), (status, _, _) in zip(calls, answers, strict=True)
                     if status == 200 and lease not in stale.values()}
    assert {derived_key("agents", k) for k in admitted_keys} <= set(sent)


async def test_one_locked_resource_does_not_hold_the_rest_of_its_batch(gw: Gw) -> None:
    """A transaction holds one lease row; an effect on it goes out in the
    same turn as effects on ten other resources. They are answered before
    the lock is let go: the batch skips the held row and sends that effect
    alone, where only it waits."""
    hot = await gw.leases.claim("run:hot", ttl=60)
    others = [await gw.leases.claim(f"run:c{i}", ttl=60) for i in range(10)]
    assert hot is not None and all(others)
    locker = await gw.pool.acquire()
    tx = locker.transaction()
    await tx.start()
    await locker.execute("SELECT 1 FROM fencegate_leases WHERE resource = 'run:hot' "
                         "FOR NO KEY UPDATE")
    done_at: dict[str, float] = {}

    async def send(lease: object, key: str) -> int:
        status, _, _ = await gw.request("POST", "/v1/http/hook/x", gw.headers(lease, key),
                                        json={})  # type: ignore[arg-type]
        done_at[key] = time.monotonic()
        return status

    hot_call = asyncio.ensure_future(send(hot, "hot"))
    rest = [asyncio.ensure_future(send(o, f"c{i}")) for i, o in enumerate(others)]
    assert await asyncio.gather(*rest) == [200] * 10
    assert not hot_call.done()
    released_at = time.monotonic()
    await tx.rollback()
    await gw.pool.release(locker)
    assert await hot_call == 200
    assert all(done_at[f"c{i}"] < released_at for i in range(10))
    assert done_at["hot"] > released_at


async def test_concurrent_claims_of_one_process_share_statements(pool: asyncpg.Pool) -> None:
    """Thirty-two claims at once from one client: every resource won once,
    the same resource twice is won once; renewals and releases likewise."""
    client = LeaseClient(pool=pool)
    resources = [f"run:m{i % 24}" for i in range(32)]  # eight asked twice
    leases = await asyncio.gather(*(client.claim(r, ttl=30) for r in resources))
    won = Counter(lease.resource for lease in leases if lease is not None)
    assert set(won) == set(resources) and all(n == 1 for n in won.values())
    held = [lease for lease in leases if lease is not None]
    expiries = await asyncio.gather(*(client.renew(x.resource, x.owner, x.fence, 60)
                                      for x in held))
    assert all(e is not None and e > x.expires_at for e, x in zip(expiries, held, strict=True))
    stale = await client.renew(held[0].resource, held[0].owner, held[0].fence - 1, 60)
    assert stale is None
    released = await asyncio.gather(*(client.release(x.resource, x.owner, x.fence)
                                      for x in held))
    assert all(released)
    assert await pool.fetchval("SELECT count(*) FROM fencegate_leases "
                               "WHERE expires_at > clock_timestamp()") == 0
