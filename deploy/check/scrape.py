"""One real scrape: a real Prometheus (Debian's) scrapes ``fencegate serve
--workers 2`` and a worker process while a zombie is refused, and everything
is asserted through Prometheus's HTTP API.

    .venv/bin/python deploy/check/scrape.py      # (make deploy-check runs it)

It checks that the stale-fence rejection, the effect outcomes, the queue depth,
the job events and the lease renewals arrived with the right values; that the
zombie raises FencegateStaleFenceRejected and the dead job FencegateDeadJobs,
while the critical alerts stay quiet; that every metric name used by
deploy/prometheus/rules.yml and deploy/grafana/fencegate.json exists in what
Prometheus stored; and that every dashboard query returns data.

PostgreSQL: ``FENCEGATE_DATABASE_URL``, or the embedded one (as ``make run``).
Queues and resources get a fresh suffix per run, so an old database is fine.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from gateway.api.auth import key_sha256  # noqa: E402
from gateway.dev.sinks import SmtpSink, WebhookSink  # noqa: E402
from leases import database  # noqa: E402

RULES = ROOT / "deploy" / "prometheus" / "rules.yml"
DASHBOARD = ROOT / "deploy" / "grafana" / "fencegate.json"
API_KEY = "deploy-check-" + secrets.token_hex(8)
RUN = secrets.token_hex(3)
OUTREACH, BACKLOG, RESOURCE = f"outreach-{RUN}", f"backlog-{RUN}", f"run:zombie-{RUN}"
#: how long anything may take to show up before the check fails (not a measurement)
DEADLINE_SECONDS = 90.0
#: Grafana's variables, as a query of every series
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "1m", "$__range": "5m",
                     "$queue": ".*", "$provider": ".*", "$job": ".*", "$instance": ".*"}


class CheckFailed(Exception):
    pass


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def say(what: str) -> None:
    print(f"deploy-check scrape: {what}", flush=True)


async def eventually(what: str, probe: Callable[[], Awaitable[Any]]) -> Any:
    """``probe()`` until it answers something true; fail after the deadline."""
    deadline = time.monotonic() + DEADLINE_SECONDS
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = await probe()
        except (aiohttp.ClientError, OSError) as exc:
            last = exc
        if last and not isinstance(last, Exception):
            return last
        await asyncio.sleep(0.5)
    raise CheckFailed(f"{what}: not seen within {DEADLINE_SECONDS:.0f}s (last: {last!r})")


class Prometheus:
    def __init__(self, http: aiohttp.ClientSession, url: str) -> None:
        self.http, self.url = http, url

    async def api(self, path: str, **params: str) -> Any:
        async with self.http.get(self.url + "/api/v1/" + path, params=params) as r:
            body = await r.json()
        if body.get("status") != "success":
            raise CheckFailed(f"Prometheus refused {path} {params}: {body}")
        return body["data"]

    async def query(self, expr: str) -> list[dict[str, Any]]:
        data = await self.api("query", query=expr)
        result: list[dict[str, Any]] = data["result"]
        return result

    async def value(self, expr: str) -> float | None:
        result = await self.query(expr)
        if len(result) > 1:
            raise CheckFailed(f"{expr}: expected one series, got {result}")
        return float(result[0]["value"][1]) if result else None

    async def names(self) -> set[str]:
        return set(await self.api("label/__name__/values"))

    async def alerts(self) -> list[dict[str, Any]]:
        data = await self.api("alerts")
        alerts: list[dict[str, Any]] = data["alerts"]
        return alerts


def gateway_config(port: int, smtp_port: int, http_port: int) -> str:
    return f"""
[server]
host = "127.0.0.1"
port = {port}

[database]
url_env = "FENCEGATE_DATABASE_URL"

[[clients]]
name = "agents"
key_sha256 = "{key_sha256(API_KEY)}"
resources = ["run:*", "job:*"]

[providers.mail]
kind = "smtp"
host = "127.0.0.1"
port = {smtp_port}
timeout_seconds = 5

[providers.crm]
kind = "http"
base_url = "http://127.0.0.1:{http_port}/api"
timeout_seconds = 5
"""


def prometheus_config(gateway_port: int, worker_port: int) -> str:
    return json.dumps({  # JSON is YAML
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
        "rule_files": [str(RULES)],
        "scrape_configs": [
            {"job_name": "fencegate",
             "static_configs": [{"targets": [f"127.0.0.1:{gateway_port}"]}]},
            {"job_name": "fencegate-worker",
             "static_configs": [{"targets": [f"127.0.0.1:{worker_port}"]}]},
        ],
    }, indent=2)


def metric_names(text: str) -> set[str]:
    """The fencegate metric names (raw, and recorded) a rule or query uses."""
    return {m for m in re.findall(r"[A-Za-z_:][A-Za-z0-9_:]*", text) if "fencegate_" in m}


def dashboard_queries() -> list[tuple[str, str]]:
    """``(panel title, PromQL)`` of every target, Grafana variables filled in."""
    board = json.loads(DASHBOARD.read_text())
    out = []
    for panel in board["panels"]:
        for target in panel.get("targets", []):
            expr = target["expr"]
            for var, value in GRAFANA_VARIABLES.items():
                expr = expr.replace(var, value)
            out.append((panel["title"], expr))
    return out


class Processes:
    """What the check started, ended by their ids on the way out."""

    def __init__(self, logs: Path) -> None:
        self.logs = logs
        self.started: list[tuple[str, subprocess.Popen[bytes]]] = []

    def start(self, name: str, argv: list[str], env: dict[str, str]) -> None:
        with (self.logs / f"{name}.log").open("wb") as log:
            proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=ROOT)
        self.started.append((name, proc))

    def check_alive(self) -> None:
        for name, proc in self.started:
            if proc.poll() is not None:
                raise CheckFailed(f"{name} exited with {proc.returncode}:\n"
                                  + (self.logs / f"{name}.log").read_text()[-3000:])

    def stop(self) -> None:
        for _name, proc in reversed(self.started):
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for _name, proc in reversed(self.started):
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


async def zombie(http: aiohttp.ClientSession, url: str) -> None:
    """Worker A claims, stalls past its ttl; B claims and sends; A wakes and
    sends under its old fence: 412 stale_fence. B's retry is replayed."""
    auth = {"Authorization": f"Bearer {API_KEY}"}

    async def post(path: str, body: dict[str, Any], headers: dict[str, str]) -> Any:
        async with http.post(url + path, json=body, headers={**auth, **headers}) as r:
            return r.status, await r.json(content_type=None)

    status, a = await post("/v1/leases/claim",
                           {"resource": RESOURCE, "owner": "worker-a", "ttl_seconds": 1}, {})
    assert status == 200, a

    async def expired() -> bool:
        async with http.get(f"{url}/v1/leases/{RESOURCE}", headers=auth) as r:
            return not (await r.json())["live"]

    await eventually("worker-a's lease expiring", expired)
    status, b = await post("/v1/leases/claim",
                           {"resource": RESOURCE, "owner": "worker-b", "ttl_seconds": 30}, {})
    assert status == 200 and b["fence"] > a["fence"], b
    email = {"from": "agent@example.com", "to": ["lead@example.com"], "subject": "Your quote",
             "text": "Here is your quote."}

    def fenced(lease: dict[str, Any], key: str) -> dict[str, str]:
        return {"Fence-Resource": RESOURCE, "Fence-Token": str(lease["fence"]),
                "Idempotency-Key": key}

    status, sent = await post("/v1/email", email, fenced(b, f"quote-{RUN}"))
    assert status == 200, sent
    status, refused = await post("/v1/email", email, fenced(a, f"quote-{RUN}-a"))
    if status != 412 or refused.get("code") != "stale_fence":
        raise CheckFailed(f"the zombie was not refused: {status} {refused}")
    status, again = await post("/v1/email", email, fenced(b, f"quote-{RUN}"))
    assert status == 200, again
    say(f"zombie refused: 412 stale_fence (current fence {refused['current_fence']})")


async def enqueue(dsn: str) -> None:
    from leases import LeaseClient, NewJob, Queue

    async with LeaseClient(dsn) as client:
        await Queue(client, OUTREACH).enqueue_many([
            NewJob({"to": "a@example.com"}), NewJob({"to": "b@example.com"}),
            NewJob({"to": "slow@example.com", "seconds": 2.5}),  # its lease is renewed
            NewJob({"to": "refused@example.com", "fail": True}, max_attempts=1),  # dies
        ])
        await Queue(client, BACKLOG).enqueue_many([NewJob({"n": 1}), NewJob({"n": 2})])


def equals(want: float) -> Callable[[float], bool]:
    return lambda found: found == want


async def expect(prom: Prometheus, expr: str, want: Callable[[float], bool],
                 described: str) -> float:
    async def probe() -> float | None:
        found = await prom.value(expr)
        return found if found is not None and want(found) else None

    found: float = await eventually(f"{expr} {described}", probe)
    say(f"{expr} = {found:g}")
    return found


async def assertions(prom: Prometheus) -> None:
    gw, wk = 'job="fencegate"', 'job="fencegate-worker"'
    await expect(prom, f'sum(fencegate_fence_rejections_total{{{gw},provider="mail",'
                 'reason="stale_fence"})', lambda v: v == 1, "== 1")
    for outcome, count in (("succeeded", 4), ("replayed", 1)):
        await expect(prom, f'sum(fencegate_effects_total{{{gw},provider="mail",'
                     f'outcome="{outcome}"}})', equals(count), f"== {count}")
    for job in (gw, wk):
        await expect(prom, f'fencegate_queue_jobs{{{job},queue="{BACKLOG}",state="queued"}}',
                     lambda v: v == 2, "== 2")
        await expect(prom, f'fencegate_queue_jobs{{{job},queue="{OUTREACH}",state="dead"}}',
                     lambda v: v == 1, "== 1")
    await expect(prom, f'fencegate_queue_oldest_runnable_age_seconds{{{wk},queue="{BACKLOG}"}}',
                 lambda v: v > 0, "> 0")
    for event, count in (("claimed", 4), ("completed", 3), ("dead", 1)):
        await expect(prom, f'fencegate_jobs_total{{{wk},queue="{OUTREACH}",event="{event}"}}',
                     equals(count), f"== {count}")
    await expect(prom, f'fencegate_lease_renewals_total{{{wk},result="ok"}}', lambda v: v >= 1,
                 ">= 1")
    await expect(prom, f'sum(fencegate_lease_claims_total{{{gw},result="won"}})',
                 lambda v: v == 2, "== 2")
    for job in (gw, wk):
        await expect(prom, f"min(fencegate_database_up{{{job}}})", lambda v: v == 1, "== 1")


async def alerts(prom: Prometheus) -> None:
    def firing(found: list[dict[str, Any]], name: str, **labels: str) -> bool:
        return any(a["labels"].get("alertname") == name and a["state"] == "firing"
                   and all(a["labels"].get(k) == v for k, v in labels.items()) for a in found)

    async def both() -> list[dict[str, Any]] | None:
        found = await prom.alerts()
        ok = firing(found, "FencegateStaleFenceRejected", provider="mail",
                    reason="stale_fence") and firing(found, "FencegateDeadJobs", queue=OUTREACH)
        return found if ok else None

    found = await eventually("FencegateStaleFenceRejected and FencegateDeadJobs firing", both)
    say("alerts firing: " + ", ".join(sorted({a["labels"]["alertname"] for a in found
                                              if a["state"] == "firing"})))
    for quiet in ("FencegateDatabaseUnavailable", "FencegateGatewayDown",
                  "FencegateEffectOutcomeUnknown", "FencegateFenceMisuse"):
        active = [a for a in found if a["labels"]["alertname"] == quiet]
        if active:
            raise CheckFailed(f"{quiet} is {active[0]['state']} on a healthy run: {active}")


async def names_and_panels(prom: Prometheus) -> None:
    used = metric_names(RULES.read_text())
    used |= set().union(*(metric_names(expr) for _title, expr in dashboard_queries()))

    async def all_present() -> bool:
        return not used - await prom.names()

    try:
        await eventually("every metric name used", all_present)
    except CheckFailed:
        missing = sorted(used - await prom.names())
        raise CheckFailed(f"used by the rules or the dashboard, absent from live output: "
                          f"{missing}") from None
    say(f"{len(used)} metric names used by the rules and the dashboard, all present")
    for title, expr in dashboard_queries():
        if not await prom.query(expr):
            raise CheckFailed(f"dashboard panel {title!r} has no data: {expr}")
    say(f"{len(dashboard_queries())} dashboard queries, each with data")


async def run(tmp: Path) -> None:
    prometheus = shutil.which("prometheus")
    if prometheus is None:
        raise CheckFailed("no prometheus binary: apt-get install prometheus")
    dsn = database.database_url(create=True)
    smtp, hook = await SmtpSink().start(), await WebhookSink().start()
    gw_port, worker_port, prom_port = free_port(), free_port(), free_port()
    (tmp / "gateway.toml").write_text(gateway_config(gw_port, smtp.port, hook.port))
    (tmp / "prometheus.yml").write_text(prometheus_config(gw_port, worker_port))
    env = {**os.environ, database.DATABASE_URL_ENV: dsn, "FENCEGATE_API_KEY": API_KEY}
    procs = Processes(tmp)
    gw_url, prom_url = f"http://127.0.0.1:{gw_port}", f"http://127.0.0.1:{prom_port}"
    try:
        async with aiohttp.ClientSession() as http:
            procs.start("gateway", [sys.executable, "-m", "gateway.cli", "serve", "--config",
                                    str(tmp / "gateway.toml"), "--workers", "2"], env)

            async def ready() -> bool:
                procs.check_alive()
                async with http.get(gw_url + "/readyz") as r:
                    return r.status == 200

            await eventually("the gateway ready", ready)
            procs.start("worker", [sys.executable, str(ROOT / "deploy/check/worker.py"),
                                   "--gateway", gw_url, "--queue", OUTREACH, "--ttl", "3",
                                   "--metrics-port", str(worker_port),
                                   "--metrics-host", "127.0.0.1"], env)
            procs.start("prometheus", [
                prometheus, f"--config.file={tmp / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp / 'tsdb'}",
                f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"], env)
            prom = Prometheus(http, prom_url)

            async def both_up() -> bool:
                procs.check_alive()
                found = await prom.query("up == 1")
                return {s["metric"]["job"] for s in found} == {"fencegate", "fencegate-worker"}

            await eventually("Prometheus scraping the gateway and the worker", both_up)
            say(f"Prometheus {prom_url} scrapes {gw_url} (2 processes) and the worker")
            await enqueue(dsn)
            await zombie(http, gw_url)
            await assertions(prom)
            await alerts(prom)
            await names_and_panels(prom)
            procs.check_alive()
    finally:
        procs.stop()
        await smtp.close()
        await hook.close()


def main() -> int:
    tmp = Path(tempfile.mkdtemp(prefix="fencegate-scrape-"))
    try:
        asyncio.run(run(tmp))
    except (CheckFailed, AssertionError) as exc:
        print(f"deploy-check scrape: FAILED: {exc}", file=sys.stderr)
        for log in sorted(tmp.glob("*.log")):
            print(f"--- {log.name} (tail)\n{log.read_text()[-2000:]}", file=sys.stderr)
        return 1
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    say("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
