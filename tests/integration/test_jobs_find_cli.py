"""``fencegate jobs find`` and ``jobs show`` as a user runs them."""

from __future__ import annotations

import json
import os
import subprocess

import asyncpg

from leases import LeaseClient, NewJob, Queue, database
from tests.support.served import FENCEGATE


def run(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, database.DATABASE_URL_ENV: dsn}
    return subprocess.run([*FENCEGATE, *args], env=env, capture_output=True, text=True,
                          timeout=60)


async def test_find_filters_and_pages_with_the_next_command_printed(
        dsn: str, pool: asyncpg.Pool) -> None:
    q = Queue(LeaseClient(pool=pool), "charges")
    ids = await q.enqueue_many([NewJob({"customer": {"id": n % 2}, "amount": 10 * n})
                                for n in range(6)])
    mine = sorted((i for n, i in enumerate(ids) if n % 2 == 1), reverse=True)
    found = run(dsn, "jobs", "find", "charges", "--payload", "customer.id=1", "--state",
                "queued", "--limit", "2")
    assert found.returncode == 0, found.stderr
    lines = found.stdout.splitlines()
    assert lines[0].split()[:3] == ["ID", "QUEUE", "STATE"]
    assert [int(line.split()[0]) for line in lines[1:3]] == mine[:2]
    more = lines[-1]
    assert more.startswith("more: fencegate jobs find charges ") and f"--after {mine[1]}" in more
    page2 = json.loads(run(dsn, *more.removeprefix("more: fencegate ").split(), "--json").stdout)
    assert [j["id"] for j in page2["jobs"]] == mine[2:] and page2["after"] is None
    assert page2["jobs"][0]["payload"] == {"customer": {"id": 1}, "amount": 10}


async def test_a_bad_filter_is_a_clear_message_not_a_traceback(dsn: str) -> None:
    for args, says in [(("--state", "exploded"), "no job state 'exploded'"),
                       (("--payload", "customer.id"), "FIELD.PATH=VALUE"),
                       (("--since", "yesterday"), "an age like 15m"),
                       (("--limit", "0"), "limit: from 1 to 1000"),
                       (("bad queue!",), "queue names")]:
        done = run(dsn, "jobs", "find", *args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert says in done.stderr and "Traceback" not in done.stderr, done.stderr


async def test_show_prints_attempts_and_the_last_error_readably(dsn: str,
                                                                pool: asyncpg.Pool) -> None:
    q = Queue(LeaseClient(pool=pool), "charges")
    job_id = await q.enqueue({"amount": 1000}, dedupe_key="charge-1", max_attempts=3)
    [job] = await q.claim()
    await q.fail(job, "Traceback (most recent call last):\n  File \"pay.py\", line 3\n"
                 "ConnectionError: the card network timed out")
    shown = run(dsn, "jobs", "show", str(job_id))
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout
    assert text.splitlines()[0] == f"job {job_id} on charges: queued"
    assert "attempts: 1 of 3, retrying" in text
    label, error = text.split("   last error:\n")
    assert " ".join(error.split()) == ('Traceback (most recent call last): File "pay.py", '
                                       "line 3 ConnectionError: the card network timed out")
    assert all(line.startswith(" " * 15) and len(line) <= 88 for line in error.splitlines())
    assert "dedupe_key: charge-1" in label
    assert json.loads(run(dsn, "jobs", "show", str(job_id), "--json").stdout)["attempts"] == 1
