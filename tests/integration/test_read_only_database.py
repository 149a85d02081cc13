"""A database that answers but will not write: what a client sees for a moment
after a PostgreSQL failover (a demoted primary, a standby behind a pooler that
has not moved yet, a multi-host DSN that finds no writable host while a standby
is promoted). Played here with ``default_transaction_read_only`` on the test's
database and its sessions terminated, so every new session is read-only.

Both must read it as "no answer", never as a refusal or a bug: the gateway
fails closed (503 ``unavailable``, nothing sent) and recovers by itself; a
lease keeps renewing through it.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncpg
import pytest

from leases import LeaseClient, policy
from tests.integration.conftest import Gw
from tests.support.waiting import until


class ReadOnly:
    """Turns the test's database read-only and back, from the maintenance
    database (so the switch itself is never cut off)."""

    def __init__(self, admin: asyncpg.Connection, database: str) -> None:
        self.admin = admin
        self.database = database

    async def set(self, on: bool) -> None:
        value = "on" if on else "off"
        await self.admin.execute(
            f'ALTER DATABASE "{self.database}" SET default_transaction_read_only = {value}')
        # sessions keep the setting they started with: end them all
        await self.admin.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                                 "WHERE datname = $1", self.database)


@pytest.fixture
async def read_only(template_ready: str, pool: asyncpg.Pool) -> AsyncIterator[ReadOnly]:
    admin = await asyncpg.connect(template_ready)
    switch = ReadOnly(admin, await pool.fetchval("SELECT current_database()"))
    yield switch
    await switch.set(False)
    await admin.close()


@pytest.mark.parametrize("session_attrs", ["", "target_session_attrs=read-write"])
async def test_the_gateway_answers_503_on_a_read_only_database_and_recovers(
    make_gw: Callable[..., Awaitable[Gw]], dsn: str, read_only: ReadOnly,
    session_attrs: str,
) -> None:
    """Without a session attribute, the admission fails with 25006 (read-only
    transaction); with ``target_session_attrs=read-write`` (a multi-host DSN
    after a failover), asyncpg finds no host to connect to. Both were a 500."""
    if session_attrs:
        dsn += ("&" if "?" in dsn else "?") + session_attrs
    gw = await make_gw(dsn, database_timeout_seconds=1.0)
    lease = await gw.leases.claim("run:ro", ttl=60)
    assert lease is not None
    assert (await gw.email(lease, "before"))[0] == 200
    before = await gw.metric("fencegate_db_unavailable_total")
    await read_only.set(True)
    for i in range(3):
        status, headers, body = await gw.email(lease, f"during-{i}")
        assert (status, body["code"]) == (503, "unavailable"), body
        assert headers["Retry-After"] == "1"
    assert len(gw.smtp.deliveries) == 1  # nothing was sent while read-only
    assert await gw.metric("fencegate_db_unavailable_total") >= before + 3
    await read_only.set(False)
    await gw.pool.expire_connections()  # the test's own pool, used by gw.leases
    answers: list[tuple[int, object]] = []

    async def sent() -> bool:  # no restart: the gateway's pool reconnects by itself
        status, _, body = await gw.email(lease, "during-0")
        answers.append((status, body))
        return status == 200

    await until(sent, "an email sent once the database is writable again", every=0.1)
    assert len(gw.smtp.deliveries) == 2


async def test_a_lease_keeps_renewing_through_a_read_only_moment(
    dsn: str, read_only: ReadOnly, caplog: pytest.LogCaptureFixture,
) -> None:
    """A renewal answered "read-only" is no answer, retried until the lease's
    safety deadline; it was a loss at once ("renewal failed")."""
    caplog.set_level(logging.INFO, logger="fencegate.leases")
    async with LeaseClient(dsn, owner="w") as client:
        # the first renewal after 0.6 s, the deadline 24 s away: the read-only
        # moment and its end fall between them on any machine
        lease = await client.claim("run:renew-ro", ttl=30.0, renewal=policy.RenewalPolicy(
            30.0, renew_fraction=0.02, retry_fraction=0.01))
        assert lease is not None
        async with lease:
            await read_only.set(True)
            await until(lambda: any("retrying" in str(r.msg) for r in caplog.records),
                        "a renewal refused as read-only")
            assert lease.lost is None, lease.lost
            first_expiry = lease.expires_at
            await read_only.set(False)
            await until(lambda: lease.expires_at > first_expiry or lease.lost is not None,
                        "a retry landing on a writable session")
            assert lease.lost is None, lease.lost
            lease.check()
