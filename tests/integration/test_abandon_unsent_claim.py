"""A claim that never reached the database is not abandoned and leaves no
lease row: the resource still reads never claimed (``fence: null``), and an
effect on it is refused ``no_lease``, never ``stale_fence`` with a fence nobody
was granted."""

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
