"""`fencegate lease claim` without --owner whose answer is lost abandons the
claim before the command ends: the resource is not left for its whole ttl to
an owner nobody knows."""

from __future__ import annotations

import asyncio
import os
import sys

import asyncpg

from leases import database
from tests.support.cutproxy import CutProxy

RESOURCE = "run:cli-orphan"


async def _fencegate(dsn: str, *args: str) -> tuple[int, str, str]:
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "gateway.cli", *args,
        env={**os.environ, database.DATABASE_URL_ENV: dsn},
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 30)
    assert proc.returncode is not None
    return proc.returncode, out.decode(), err.decode()


async def test_a_cli_claim_whose_answer_was_lost_is_abandoned(
    dsn: str, pool: asyncpg.Pool,
) -> None:
    proxy = await CutProxy(dsn, marker=RESOURCE.encode()).start()
    try:
        code, _, err = await _fencegate(proxy.dsn(), "lease", "claim", RESOURCE,
                                        "--ttl", "3600")
    finally:
        await proxy.close()
    assert proxy.cut.is_set(), "the claim's answer was not the one lost"
    assert code == 2 and "no answer from the database" in err, (code, err)
    row = await pool.fetchrow("SELECT owner, fence, expires_at > clock_timestamp() AS live "
                              "FROM fencegate_leases WHERE resource = $1", RESOURCE)
    assert row is not None, "the claim did not commit: the test proves nothing"
    # The command has exited; the database was reachable all along. A claim
    # under an owner made up for it, whose answer never came, must not hold
    # the resource (docs/leases.md: "abandoned the same way"). No wait: the
    # abandon is done before the command ends, and it has ended.
    code, out, _ = await _fencegate(dsn, "lease", "claim", RESOURCE, "--ttl", "30",
                                    "--owner", "next")
    assert code == 0, (
        f"{RESOURCE} is still held for an hour by {row['owner']!r} (fence {row['fence']}), "
        f"an owner made up by a command that exited with 'no answer from the database'; "
        f"the retry says: {out.strip()}")
