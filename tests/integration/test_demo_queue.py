"""``fencegate demo queue``: the job platform's scenario holds end to end."""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import asyncpg

from leases import database
from tests.support.served import FENCEGATE


async def test_the_queue_demo_charges_once_retries_and_replays(dsn: str, pool: asyncpg.Pool,
                                                               tmp_path: Path) -> None:
    env = {**os.environ, database.DATABASE_URL_ENV: dsn, database.HOME_ENV: str(tmp_path)}
    out = subprocess.run([*FENCEGATE, "demo", "queue"], env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout
    assert "duplicate it, the same charge delivered twice: deduplicated" in text
    assert "received 1 charge(s) for order 1001: charged once" in text
    assert re.search(r"job \d+ completed after retrying on its own", text)
    assert re.search(r"job \d+ is dead after 3 of 3 attempts, kept with its last error: "
                     r"ValueError", text)
    assert re.search(r"job \d+ completed after the replay", text)
    # what the timeline says is what the database holds
    rows = {r["kind"]: r for r in await pool.fetch(
        "SELECT payload->>'kind' AS kind, state, attempts, count(*) OVER (PARTITION BY "
        "payload->>'kind') AS jobs FROM fencegate_jobs WHERE queue LIKE 'demo-charges-%'")}
    assert {k: (r["state"], r["jobs"]) for k, r in rows.items()} == {
        "charge": ("completed", 1), "flaky": ("completed", 1), "poison": ("completed", 1)}
    assert rows["flaky"]["attempts"] == 3
    assert rows["poison"]["attempts"] == 1, "replayed with its attempts reset"
    assert list(tmp_path.iterdir()) == [], "the demo writes no dev files"


async def test_the_queue_demo_runs_again(dsn: str, tmp_path: Path) -> None:
    env = {**os.environ, database.DATABASE_URL_ENV: dsn, database.HOME_ENV: str(tmp_path)}
    for _ in range(2):
        out = subprocess.run([*FENCEGATE, "demo", "queue"], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stdout + out.stderr
        assert "charged once" in out.stdout
