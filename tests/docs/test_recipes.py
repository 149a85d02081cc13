"""The recipes in docs/recipes/ do what they say, again and again: a second
run against the same database works (and sends nothing new), and a recipe
that could not do its job fails loudly instead of reporting success. The
fenced-writes recipes leave, run after run, only the new holder's writes:
never the zombie's."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from leases import LeaseClient, database
from tests.integration.conftest import API_KEY, Gw
from tests.support.snippets import ROOT, SNIPPETS, Snippet


def recipe(name: str) -> Snippet:
    found = [s for s in SNIPPETS if s.path == ROOT / "docs" / "recipes" / name
             and s.lang == "python" and s.not_run is None]
    assert len(found) == 1, name
    return found[0]


def run(snippet: Snippet, gw: Gw, dsn: str, tmp_path: Path) -> subprocess.CompletedProcess[str]:
    script = tmp_path / "recipe.py"
    script.write_text(snippet.code)
    env = {**os.environ, "FG": gw.url, "FG_KEY": API_KEY, database.DATABASE_URL_ENV: dsn,
           "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", ["procrastinate.md", "langgraph.md"])
async def test_a_recipe_runs_twice_on_one_database_and_sends_once(
        name: str, gw: Gw, dsn: str, tmp_path: Path) -> None:
    for attempt in range(2):
        ran = await asyncio.to_thread(run, recipe(name), gw, dsn, tmp_path)
        assert ran.returncode == 0, f"run {attempt}:\n{ran.stdout}\n{ran.stderr}"
    assert len(gw.smtp.deliveries) == 1


async def test_the_langgraph_recipe_fails_loudly_when_it_cannot_send(
        gw: Gw, dsn: str, tmp_path: Path) -> None:
    """lead:42 held by another run: the recipe sent nothing, so it must not
    end as if it had."""
    async with LeaseClient(dsn, owner="another-run") as other:
        assert await other.claim("lead:42", ttl=120) is not None
        ran = await asyncio.to_thread(run, recipe("langgraph.md"), gw, dsn, tmp_path)
    assert ran.returncode != 0
    assert "LeadBusy" in ran.stderr and "lead:42" in ran.stderr
    assert "sent once" not in ran.stdout
    assert gw.smtp.deliveries == []


async def test_the_fenced_writes_recipe_leaves_only_the_new_holders_charge(
        gw: Gw, dsn: str, tmp_path: Path) -> None:
    """Each run: one order, charged and completed by worker B in one
    transaction, its receipt sent once; worker A's charge, refused, is in no
    run's table, and it sent nothing."""
    for attempt in range(2):
        ran = await asyncio.to_thread(run, recipe("fenced-writes.md"), gw, dsn, tmp_path)
        assert ran.returncode == 0, f"run {attempt}:\n{ran.stdout}\n{ran.stderr}"
        assert "worker A was refused (stale_fence)" in ran.stdout
    conn = await asyncpg.connect(dsn)
    try:
        charged = await conn.fetch("SELECT order_id, charged_by FROM charges ORDER BY id")
        orders = await conn.fetchval("SELECT count(*) FROM orders")
        states = await conn.fetch("SELECT state, result_ref FROM fencegate_jobs ORDER BY id")
    finally:
        await conn.close()
    assert [r["charged_by"] for r in charged] == ["worker-b", "worker-b"]
    assert len({r["order_id"] for r in charged}) == orders == 2
    assert [r["state"] for r in states] == ["completed", "completed"]
    assert len(gw.smtp.deliveries) == 2  # one receipt per order


@pytest.mark.parametrize("name", ["fenced-writes-psycopg.md", "fenced-writes-psycopg-async.md",
                                  "fenced-writes-sqlalchemy.md"])
async def test_a_drivers_fenced_write_commits_and_the_zombies_rolls_back(
        name: str, gw: Gw, dsn: str, tmp_path: Path) -> None:
    """psycopg (sync, async) and SQLAlchemy: the new holder's payout commits,
    the zombie's is refused with FG412 and rolled back, run after run."""
    for attempt in range(2):
        ran = await asyncio.to_thread(run, recipe(name), gw, dsn, tmp_path)
        assert ran.returncode == 0, f"run {attempt}:\n{ran.stdout}\n{ran.stderr}"
        assert "worker A was refused (stale_fence)" in ran.stdout
    conn = await asyncpg.connect(dsn)
    try:
        paid = await conn.fetch("SELECT paid_by FROM payouts ORDER BY id")
    finally:
        await conn.close()
    assert [r["paid_by"] for r in paid] == ["worker-b", "worker-b"]
    assert gw.smtp.deliveries == []


async def test_the_receiver_recipe_runs_twice_on_one_database(
        gw: Gw, dsn: str, tmp_path: Path) -> None:
    """The second run meets the first run's fences in the receiver's table:
    its leases' fences are newer, so its holder passes and its zombie is
    refused again."""
    for attempt in range(2):
        ran = await asyncio.to_thread(run, recipe("webhook-receiver.md"), gw, dsn, tmp_path)
        assert ran.returncode == 0, f"run {attempt}:\n{ran.stdout}\n{ran.stderr}"
        assert "the zombie's late request: 412 stale_fence: " in ran.stdout
        assert "a forged fence: 401 bad_fence_signature: " in ran.stdout
