"""``fencegate jobs cancel|pause|resume|queues`` and unique keys, as a user
types them."""

from __future__ import annotations

import json

from tests.integration.test_cli import run


def test_jobs_cancel_pause_resume_and_unique_keys(dsn: str) -> None:
    first = json.loads(run(dsn, "jobs", "enqueue", "mail", "--unique-key", "acct-1",
                           "--json").stdout)
    again = run(dsn, "jobs", "enqueue", "mail", "--unique-key", "acct-1")
    assert again.returncode == 0
    assert f"job {first['id']} on mail was already there (unique key 'acct-1')" in again.stdout
    bad = run(dsn, "jobs", "enqueue", "mail", "--unique-for", "60")
    assert bad.returncode == 2 and "unique_for needs a unique_key" in bad.stderr
    assert "Traceback" not in bad.stderr

    paused = run(dsn, "jobs", "pause", "mail")
    assert paused.returncode == 0 and "queue mail paused" in paused.stdout
    queues = json.loads(run(dsn, "jobs", "queues", "--json").stdout)["queues"]
    assert [(q["queue"], q["state"]) for q in queues] == [("mail", "paused")]
    resumed = run(dsn, "jobs", "resume", "mail")
    assert resumed.returncode == 0 and "queue mail resumed" in resumed.stdout
    assert "was not paused" in run(dsn, "jobs", "resume", "mail").stdout

    cancelled = run(dsn, "jobs", "cancel", "mail", str(first["id"]), "999999")
    assert cancelled.returncode == 1
    assert f"job {first['id']}: cancelled (it was queued)" in cancelled.stdout
    assert "job 999999: not cancelled: no such job on queue 'mail'" in cancelled.stdout
    twice = json.loads(run(dsn, "jobs", "cancel", "mail", str(first["id"]), "--json").stdout)
    assert twice["not_cancelled"] == {str(first["id"]): "cancelled"}
    listed = run(dsn, "jobs", "list", "mail", "--state", "cancelled")
    assert str(first["id"]) in listed.stdout and "cancelled" in listed.stdout
    shown = json.loads(run(dsn, "jobs", "show", str(first["id"]), "--json").stdout)
    assert shown["state"] == "cancelled" and shown["unique_key"] == "acct-1"
    worse = run(dsn, "jobs", "pause", "no spaces")
    assert worse.returncode != 0 and "Traceback" not in worse.stderr
