"""Writes fencegate.json, the Grafana dashboard, from the panel list below.

    python deploy/grafana/build.py       # after changing a panel; commit both

`make deploy-check` fails if fencegate.json differs from what this writes, and
runs every query below against a real Prometheus (deploy/check/scrape.py).
Most panels read the recording rules of deploy/prometheus/rules.yml.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DS = {"type": "prometheus", "uid": "${datasource}"}

# (title, kind, unit, [(expr, legend)], width, description)
Panel = tuple[str, str, str, list[tuple[str, str]], int, str]

ROWS: list[tuple[str, list[Panel]]] = [
    ("At a glance", [
        ("Database reachable", "stat", "none",
         [("min(job:fencegate_database_up:min)", "")], 6,
         "1: every process reads PostgreSQL. 0: fencegate is failing closed (503, "
         "nothing sent)."),
        ("Zombies refused (1h)", "stat", "none",
         [('sum(increase(fencegate_fence_rejections_total{reason=~"stale_fence|lease_expired"}'
           "[1h]))", "")], 6,
         "Effects refused because the sender's lease was superseded or expired."),
        ("Unknown outcomes (1h)", "stat", "none",
         [('sum(increase(fencegate_effects_total{outcome="unknown"}[1h]))', "")], 6,
         "Effects an operator must resolve: fencegate effects list --state unknown."),
        ("Dead jobs", "stat", "none",
         [('sum(queue_state:fencegate_queue_jobs:max{state="dead"})', "")], 6,
         "Jobs out of attempts, waiting for a replay."),
    ]),
    ("Effects", [
        ("Effects by outcome", "timeseries", "reqps",
         [('sum by (outcome) (provider_outcome:fencegate_effects:rate5m'
           '{provider=~"$provider"})', "{{outcome}}")], 12,
         "Effect requests per second, by the gateway's verdict."),
        ("Fence rejections by reason and provider", "timeseries", "reqps",
         [('provider_reason:fencegate_fence_rejections:rate5m{provider=~"$provider"}',
           "{{provider}} {{reason}}")], 12,
         "stale_fence / lease_expired: a zombie was stopped. no_lease / invalid_fence: a "
         "worker sends fences it never got."),
        ("Gateway latency", "timeseries", "s",
         [('route:fencegate_http_request_duration_seconds:quantile5m{route=~"/v1/.*"}',
           "{{route}} p{{quantile}}")], 12,
         "Percentiles of the gateway's answers, by route (5-minute windows)."),
        ("Provider latency", "timeseries", "s",
         [('provider:fencegate_provider_request_duration_seconds:quantile5m'
           '{provider=~"$provider"}', "{{provider}} p{{quantile}}")], 12,
         "Percentiles of the calls the gateway makes to providers."),
        ("Provider pace", "timeseries", "none",
         [('sum by (provider) (rate(fencegate_provider_paused_seconds_total'
           '{provider=~"$provider"}[5m]))', "{{provider}} paused (s/s)"),
          ('sum by (provider, reason) (rate(fencegate_rate_limited_total'
           '{provider=~"$provider"}[5m]))', "{{provider}} refused 429 {{reason}} (/s)")], 24,
         "Seconds per second a provider was paused by its own 429 (summed over gateway "
         "processes: 1 is one process paused all the time), and effects refused 429 "
         "rate_limited: configured_rate (rate_limit_per_second) or provider_paused."),
    ]),
    ("Database", [
        ("Database availability", "timeseries", "none",
         [("job:fencegate_database_up:min", "{{job}} up"),
          ("job:fencegate_db_unavailable:rate5m", "{{job}} requests refused (503/s)")], 24,
         "fencegate_database_up per job (0 = unreachable) and the rate of requests "
         "refused with 503 unavailable."),
    ]),
    ("Queue", [
        ("Queue depth", "timeseries", "none",
         [('queue_state:fencegate_queue_jobs:max{queue=~"$queue",state!="dead"}',
           "{{queue}} {{state}}")], 8,
         "Jobs queued (due now), scheduled (due later) and claimed, per queue."),
        ("Dead letters", "timeseries", "none",
         [('queue_state:fencegate_queue_jobs:max{queue=~"$queue",state="dead"}',
           "{{queue}}")], 8,
         "Dead jobs per queue: fencegate jobs dead QUEUE; fencegate jobs replay QUEUE."),
        ("Oldest due job", "timeseries", "s",
         [('queue:fencegate_queue_oldest_runnable_age_seconds:max{queue=~"$queue"}',
           "{{queue}}")], 8,
         "How long the oldest due job of each queue has waited."),
        ("Job events", "timeseries", "ops",
         [('queue_event:fencegate_jobs:rate5m{queue=~"$queue"}', "{{queue}} {{event}}")], 24,
         "Enqueued, claimed, completed, retried, dead and replayed jobs per second."),
        ("Paused queues", "timeseries", "none",
         [('queue:fencegate_queue_paused:max{queue=~"$queue"}', "{{queue}}")], 12,
         "1 while a queue is paused (fencegate jobs pause QUEUE): nothing is claimed from "
         "it; fencegate jobs resume QUEUE."),
        ("Cancels and snoozes", "timeseries", "ops",
         [('queue_event:fencegate_jobs:rate5m{queue=~"$queue",event=~"cancelled|snoozed"}',
           "{{queue}} {{event}}")], 12,
         "Jobs cancelled (fencegate jobs cancel) and runs snoozed from their handlers, per "
         "second."),
    ]),
    ("Leases", [
        ("Lease claims", "timeseries", "ops",
         [("result:fencegate_lease_claims:rate5m", "{{result}}")], 12,
         "won: a fence was issued. held: someone else holds the lease (a normal answer)."),
        ("Lease renewals", "timeseries", "ops",
         [("result:fencegate_lease_renewals:rate5m", "{{result}}")], 12,
         "lost: a holder found its lease gone and cancelled its work."),
    ]),
]


def variable(name: str, label: str, metric: str) -> dict[str, Any]:
    return {
        "name": name, "label": label, "type": "query", "datasource": DS,
        "query": {"query": f"label_values({metric}, {name})", "refId": name},
        "definition": f"label_values({metric}, {name})", "refresh": 2,
        "multi": True, "includeAll": True, "allValue": ".*",
        "current": {"text": "All", "value": "$__all"}, "sort": 1,
    }


def dashboard() -> dict[str, Any]:
    panels: list[dict[str, Any]] = []
    y = 0
    for row_title, row in ROWS:
        panels.append({"id": len(panels) + 1, "type": "row", "title": row_title,
                       "collapsed": False, "gridPos": {"h": 1, "w": 24, "x": 0, "y": y},
                       "panels": []})
        y += 1
        x = 0
        for title, kind, unit, queries, width, description in row:
            if x + width > 24:
                x, y = 0, y + 8
            height = 4 if kind == "stat" else 8
            panels.append({
                "id": len(panels) + 1, "type": kind, "title": title,
                "description": description, "datasource": DS,
                "gridPos": {"h": height, "w": width, "x": x, "y": y},
                "fieldConfig": {"defaults": {"unit": unit}, "overrides": []},
                "options": {"legend": {"displayMode": "list", "placement": "bottom"}}
                if kind == "timeseries" else {"reduceOptions": {"calcs": ["lastNotNull"]}},
                "targets": [{"refId": chr(ord("A") + i), "datasource": DS, "expr": expr,
                             "legendFormat": legend or "__auto"}
                            for i, (expr, legend) in enumerate(queries)],
            })
            x += width
        y += 4 if all(p[1] == "stat" for p in row) else 8
    return {
        "uid": "fencegate", "title": "fencegate", "tags": ["fencegate"],
        "description": "Effects, fence rejections, latency, the database, the queue and "
                       "leases. Alerts: deploy/prometheus/rules.yml; docs/operations.md.",
        "editable": True, "schemaVersion": 39, "version": 1, "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"}, "timezone": "",
        "templating": {"list": [
            {"name": "datasource", "label": "Prometheus", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0},
            variable("provider", "Provider", "fencegate_effects_total"),
            variable("queue", "Queue", "fencegate_queue_jobs"),
        ]},
        "annotations": {"list": []},
        "panels": panels,
    }


def render() -> str:
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    out = HERE / "fencegate.json"
    out.write_text(render())
    print(f"wrote {out}", file=sys.stderr)
