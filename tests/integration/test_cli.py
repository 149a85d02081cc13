"""The command line and the server, as real processes."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
from pathlib import Path

import aiohttp
import asyncpg

from gateway.dev.sinks import SmtpSink, WebhookSink
from leases import database, sql
from tests.support.served import FENCEGATE, serve_gateway
from tests.support.waiting import GENEROUS_SECONDS, until

ROOT = Path(__file__).resolve().parents[2]
#: series only a worker process exports (leases.observe; deploy-check scrapes
#: both), and the queue gauges, one series per queue that has jobs
FROM_WORKERS = {"fencegate_jobs_total", "fencegate_lease_renewals_total",
                "fencegate_queue_jobs", "fencegate_queue_oldest_runnable_age_seconds",
                "fencegate_queue_paused"}
#: per session: two test runs at once share the server
MIGRATE_RACE_DB = f"fg_test_{os.getpid()}_migrate_race"


def _used_by_rules_and_dashboard() -> set[str]:
    """The raw metric names deploy/'s alert rules and Grafana dashboard read
    (histogram buckets left out: they exist once something was timed)."""
    text = ((ROOT / "deploy" / "prometheus" / "rules.yml").read_text()
            + (ROOT / "deploy" / "grafana" / "fencegate.json").read_text())
    return {n for n in re.findall(r"(?<![:\w])fencegate_[a-z0-9_]+", text)
            if not n.endswith("_bucket")}


def run(dsn: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, database.DATABASE_URL_ENV: dsn}
    return subprocess.run([*FENCEGATE, *args], env=env, capture_output=True, text=True,
                          timeout=60)


def test_lease_commands_claim_show_renew_release(dsn: str) -> None:
    claimed = run(dsn, "lease", "claim", "run:cli", "--ttl", "30", "--owner", "me", "--json")
    assert claimed.returncode == 0, claimed.stderr
    lease = json.loads(claimed.stdout)
    assert lease["owner"] == "me" and lease["fence"] > 0
    held = run(dsn, "lease", "claim", "run:cli", "--owner", "you")
    assert held.returncode == 1 and "held by another owner" in held.stdout
    shown = json.loads(run(dsn, "lease", "show", "run:cli", "--json").stdout)
    assert shown["live"] is True and shown["fence"] == lease["fence"]
    fence = str(lease["fence"])
    assert run(dsn, "lease", "renew", "run:cli", "--fence", fence, "--owner", "me").returncode \
        == 0
    assert run(dsn, "lease", "renew", "run:cli", "--fence", fence, "--owner", "you").returncode \
        == 1
    released = run(dsn, "lease", "release", "run:cli", "--fence", fence, "--owner", "me")
    assert released.returncode == 0 and "released" in released.stdout
    text = run(dsn, "lease", "show", "run:cli").stdout
    assert "not live" in text and fence in text


def test_bad_arguments_get_a_clear_error(dsn: str) -> None:
    out = run(dsn, "lease", "claim", "bad resource")
    assert out.returncode == 2 and "resource must be" in out.stderr
    assert "Traceback" not in out.stderr


async def test_a_newer_schema_is_used_if_additive_and_refused_if_breaking(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    await conn.execute("INSERT INTO fencegate_migrations (version, name) VALUES (999, 'x')")
    await conn.close()
    out = await asyncio.to_thread(run, dsn, "migrate")
    assert out.returncode == 0, out.stderr  # newer, but additive: usable (a rolling upgrade)
    async with asyncpg.create_pool(dsn) as p:
        await p.execute("UPDATE fencegate_migrations SET breaking = true WHERE version = 999")
    out = await asyncio.to_thread(run, dsn, "migrate")
    assert out.returncode == 2 and "upgrade fencegate" in out.stderr


async def test_concurrent_migrations_apply_once(template_ready: str) -> None:
    admin = await asyncpg.connect(template_ready)
    await admin.execute(f'DROP DATABASE IF EXISTS "{MIGRATE_RACE_DB}"')
    await admin.execute(f'CREATE DATABASE "{MIGRATE_RACE_DB}"')
    dsn = database.with_database(template_ready, MIGRATE_RACE_DB)
    try:
        results = await asyncio.gather(*(asyncio.to_thread(run, dsn, "migrate", "--json")
                                         for _ in range(4)))
        assert all(r.returncode == 0 for r in results), [r.stderr for r in results]
        applied = [json.loads(r.stdout)["applied"] for r in results]
        # one process applied every migration; the others waited and found none to do
        assert sorted(map(len, applied)) == [0, 0, 0, len(sql.migrations())]
    finally:
        await admin.execute(f'DROP DATABASE IF EXISTS "{MIGRATE_RACE_DB}" WITH (FORCE)')
        await admin.close()


def test_demo_tells_the_zombie_story(dsn: str, tmp_path: Path) -> None:
    env = {**os.environ, database.DATABASE_URL_ENV: dsn, database.HOME_ENV: str(tmp_path)}
    out = subprocess.run([*FENCEGATE, "demo"], env=env, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "refuses worker-a: 412 stale_fence" in out.stdout
    assert "received 1 message(s)" in out.stdout


def _children(pid: int) -> list[int]:
    """Live serving processes started by ``pid`` (from /proc; multiprocessing's
    resource tracker is a child too, and is left out)."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(fields[1]) == pid and fields[0] != "Z" and b"resource_tracker" not in cmdline:
            out.append(int(stat.parent.name))
    return sorted(out)


async def test_serve_with_two_workers_shares_the_port_and_the_metrics(
    dsn: str, tmp_path: Path
) -> None:
    smtp, hook = await SmtpSink().start(), await WebhookSink().start()
    proc, url = await serve_gateway(tmp_path, dsn, f"""
[providers.mail]
kind = "smtp"
host = "127.0.0.1"
port = {smtp.port}
""", args=("--workers", "2"))
    try:
        async with aiohttp.ClientSession() as http:
            # before any traffic: every series the alert rules and the dashboard
            # read exists, so increase() sees its first step (deploy/)
            async with http.get(url + "/metrics") as r:
                exported = set(re.findall(r"^(fencegate_\w+)", await r.text(), re.MULTILINE))
            missing = _used_by_rules_and_dashboard() - exported - FROM_WORKERS
            assert not missing, f"read by deploy/ but not exported at start: {missing}"
            auth = {"Authorization": "Bearer k"}
            async with http.post(url + "/v1/leases/claim", headers=auth,
                                 json={"resource": "run:s", "ttl_seconds": 30}) as r:
                lease = await r.json()
            headers = {**auth, "Fence-Resource": "run:s", "Fence-Token": str(lease["fence"])}
            body = {"from": "a@example.com", "to": ["b@example.com"], "subject": "s",
                    "text": "t"}
            for i in range(6):
                async with http.post(url + "/v1/email", json=body,
                                     headers={**headers, "Idempotency-Key": f"k{i % 3}"}) as r:
                    assert r.status == 200
            assert len(smtp.deliveries) == 3
            # each scrape may hit either worker; the counts are summed across both
            async with http.get(url + "/metrics") as r:
                text = await r.text()
            lines = [ln for ln in text.splitlines()
                     if ln.startswith("fencegate_effects_total{")]
            total = sum(float(ln.rsplit(" ", 1)[1]) for ln in lines)
            assert total == 6
            # a serving process that dies is replaced; the port keeps answering
            first = _children(proc.pid)
            assert len(first) == 2
            os.kill(first[0], signal.SIGKILL)

            def replaced() -> bool:
                now = _children(proc.pid)
                return len(now) == 2 and first[0] not in now

            await until(replaced, f"the killed serving process {first[0]} replaced",
                        every=0.1)

            async def ready() -> bool:
                async with http.get(url + "/readyz") as r:
                    return r.status == 200

            await until(ready, "the port answering /readyz", every=0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=GENEROUS_SECONDS) == 0
        assert _children(proc.pid) == []
    finally:
        if proc.poll() is None:
            proc.kill()
        await smtp.close()
        await hook.close()
    stderr = (tmp_path / "serve.log").read_text()
    assert "Traceback" not in stderr
    for line in stderr.splitlines():  # logs are JSON, and never carry the API key
        if line.startswith("{"):
            assert '"k"' not in line and "Bearer" not in line


def test_jobs_commands(dsn: str) -> None:
    first = json.loads(run(dsn, "jobs", "enqueue", "mail", "--payload", '{"to": "a"}',
                           "--dedupe-key", "welcome:a", "--max-attempts", "1", "--json").stdout)
    again = json.loads(run(dsn, "jobs", "enqueue", "mail", "--payload", '{"to": "b"}',
                           "--dedupe-key", "welcome:a", "--json").stdout)
    assert first["id"] == again["id"]
    stats = json.loads(run(dsn, "jobs", "stats", "--json").stdout)["stats"]
    assert stats == [{"queue": "mail", "state": "queued", "jobs": 1}]
    shown = json.loads(run(dsn, "jobs", "show", str(first["id"]), "--json").stdout)
    assert shown["payload"] == {"to": "a"} and shown["state"] == "queued"

    async def kill_it() -> None:
        from leases import LeaseClient, Queue

        async with LeaseClient(dsn) as client:
            q = Queue(client, "mail")
            [job] = await q.claim()
            assert await q.fail(job, "smtp 550 password=hunter2") == "dead"

    asyncio.run(kill_it())
    dead = run(dsn, "jobs", "dead", "mail")
    assert "smtp 550" in dead.stdout and "hunter2" not in dead.stdout
    replayed = run(dsn, "jobs", "replay", "mail")
    assert replayed.returncode == 0 and "replayed 1" in replayed.stdout
    assert "queued" in run(dsn, "jobs", "list", "mail").stdout
    # a queued job named for replay: one line that says why nothing happened
    queued = run(dsn, "jobs", "replay", "mail", str(first["id"]), "999999")
    assert queued.returncode == 1
    assert queued.stdout.splitlines() == [
        "replayed 0 of 2 jobs on mail",
        f"  job {first['id']}: not replayed: it is queued, not dead: nothing to replay",
        "  job 999999: not replayed: no such job"], queued.stdout
    assert "replayed 0 jobs" not in queued.stderr
    bad = run(dsn, "jobs", "enqueue", "mail", "--payload", "{not json")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


async def test_effects_commands_show_list_and_resolve(dsn: str) -> None:
    conn = await asyncpg.connect(dsn)
    await conn.execute("""
        INSERT INTO fencegate_leases (resource, owner, fence, claimed_at, expires_at)
        VALUES ('run:1', 'w', 1, clock_timestamp(), clock_timestamp() + interval '1 hour')""")
    verdict = await conn.fetchval(
        "SELECT verdict FROM fencegate_admit_effect('agents', 'welcome-1', '\\x00'::bytea, "
        "'run:1', 1, 'mail', 7, 3600, 0, 5)")
    assert verdict == "admitted"
    # the attempt may still be under way (its deadline is an hour off): not yet
    early = await asyncio.to_thread(run, dsn, "effects", "resolve", "welcome-1", "--client",
                                    "agents", "--outcome", "sent")
    assert early.returncode == 1 and "can be resolved in" in early.stderr, early.stderr
    # as if its deadline and its grace had passed: the gateway that sent it is gone
    await conn.execute("UPDATE fencegate_effects SET deadline = deadline - interval '2 hours'")
    await conn.close()
    shown = json.loads((await asyncio.to_thread(
        run, dsn, "effects", "show", "welcome-1", "--client", "agents", "--json")).stdout)
    assert shown["state"] == "unknown" and shown["fence"] == 1
    # one client has the key: --client may be left out
    alone = json.loads((await asyncio.to_thread(
        run, dsn, "effects", "show", "welcome-1", "--json")).stdout)
    assert alone == shown
    listed = (await asyncio.to_thread(run, dsn, "effects", "list", "--state", "unknown")).stdout
    assert listed.splitlines()[0].split() == ["STATE", "CLIENT", "IDEMPOTENCY_KEY", "RESOURCE",
                                              "FENCE", "PROVIDER", "CREATED_AT"]
    assert "welcome-1" in listed
    resolved = await asyncio.to_thread(run, dsn, "effects", "resolve", "welcome-1", "--client",
                                       "agents", "--outcome", "sent")
    assert resolved.returncode == 0 and "resolved as sent" in resolved.stdout
    async with asyncpg.create_pool(dsn, min_size=1, max_size=1) as p:  # who resolved it
        assert (await p.fetchval("SELECT operator FROM fencegate_resolutions")).startswith(
            "cli:")
    again = await asyncio.to_thread(run, dsn, "effects", "resolve", "welcome-1", "--client",
                                    "agents", "--outcome", "sent")
    assert again.returncode == 1
    shown = json.loads((await asyncio.to_thread(
        run, dsn, "effects", "show", "welcome-1", "--client", "agents", "--json")).stdout)
    assert shown["state"] == "succeeded"




def test_version_and_every_flag_say_what_they_are() -> None:
    """`fencegate --version` prints the version; every option of every verb
    has a help text (argparse's bare metavar is not one)."""
    from gateway.cli import parser

    out = subprocess.run([*FENCEGATE, "--version"], capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 0 and re.fullmatch(r"fencegate \d+\.\d+\.\d+\S*\n", out.stdout)
    missing = []

    def walk(p: object, path: str) -> None:
        for action in p._actions:  # type: ignore[attr-defined]
            if action.__class__.__name__ == "_SubParsersAction":
                for name, child in action.choices.items():
                    walk(child, f"{path} {name}")
            elif action.help is None:
                missing.append(f"{path} {'/'.join(action.option_strings) or action.dest}")

    walk(parser(), "fencegate")
    assert missing == []
