"""Review 8: abandoning a claim that never reached the database makes up a
lease row, and the gateway then tells callers a fence was granted on a
resource nobody ever claimed.

``LeaseClient.claim`` abandons the claim of a made-up owner on any exception,
``Busy`` included, which says "nothing was sent". ``fencegate_abandon_claim``
(migration 0008) writes the lease row in every case: with no row, it inserts
one, owner the made-up owner and a fence from ``fencegate_next_fence(0)``
that no claim ever issued. From then on the resource looks claimed:

- ``GET /v1/leases/{resource}`` answers an owner and a fence (its documented
  answer for a resource never claimed is ``fence: null``);
- an effect on it is refused ``stale_fence`` (docs/gateway.md: "a newer fence
  exists", counted in ``fencegate_fence_rejections_total{reason="stale_fence"}``,
  the zombie signal) with a ``current_fence`` nobody was ever granted, instead
  of ``no_lease`` ("no lease was ever granted on the resource", the
  FencegateFenceMisuse alert's signal).

Suggested fix: do not abandon when nothing was sent (``Busy``, a claim that
never left the batcher); and have the abandon leave a resource without a row
as it is, blocking a claim under way another way (e.g. take the advisory
lock ``pg_advisory_xact_lock(hashtext(resource))`` in both the abandon and
the checked claim), or mark the made-up row so ``show`` and the admission
read it as "never granted"."""

from __future__ import annotations

import secrets

import asyncpg
import pytest

from leases import Busy, LeaseClient, database
from tests.integration.conftest import Gw


async def test_a_claim_that_was_never_sent_leaves_the_resource_never_claimed(
    dsn: str, pool: asyncpg.Pool, gw: Gw,
) -> None:
    resource = f"run:never-{secrets.token_hex(3)}"
    tiny = await database.create_pool(dsn, min_size=1, max_size=1)
    client = LeaseClient(pool=tiny, acquire_timeout=0.1)
    held = await tiny.acquire()  # another task of the process holds the only connection
    try:
        with pytest.raises(Busy):  # "nothing was sent"
            await client.claim(resource, 10)
    finally:
        await tiny.release(held)
    await client.close()  # lets the abandon of the claim finish (it retries on Busy)
    await tiny.close()

    status, _, shown = await gw.request(
        "GET", f"/v1/leases/{resource}", {"Authorization": gw.headers()["Authorization"]})
    status_e, _, refused = await gw.email(None, key=f"k-{resource}", resource=resource,
                                          fence=1)
    assert status == 200 and shown["fence"] is None and shown["owner"] is None, (
        f"no claim of {resource} ever reached the database, yet it shows owner "
        f"{shown['owner']!r} and fence {shown['fence']}: the abandon of the claim that "
        f"was never sent made up a lease row")
    assert (status_e, refused["code"]) == (412, "no_lease"), (
        f"an effect on the never-claimed {resource} is refused {refused['code']} "
        f"(current_fence {refused.get('current_fence')}), not no_lease")
