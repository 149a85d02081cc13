"""The JSON log lines (leases/logs.py): the bytes operators grep for
(``"outcome": "stale_fence"``, docs/operations.md), whatever makes them cheaper."""

from __future__ import annotations

import datetime
import json
import logging

from leases.logs import JsonFormatter, skip_unused_fields


def test_a_line_reads_as_json_dumps_writes_it() -> None:
    when = datetime.datetime(2026, 12, 2, 19, 0, tzinfo=datetime.UTC)
    record = logging.makeLogRecord({
        "name": "fencegate.gateway.effects", "levelno": logging.INFO, "levelname": "INFO",
        "msg": "effect %s: %s", "args": ("k-é", "stale_fence"), "created": 1796238000.25,
        "msecs": 250.0, "outcome": "stale_fence", "fence": 17, "duration_ms": 1.5,
        "summary": None, "whole": True, "at": when})
    line = JsonFormatter().format(record)
    assert line == json.dumps({
        "ts": "2026-12-02T19:00:00.250Z", "level": "info",
        "logger": "fencegate.gateway.effects", "msg": "effect k-é: stale_fence",
        "outcome": "stale_fence", "fence": 17, "duration_ms": 1.5, "summary": None,
        "whole": True, "at": when}, default=str)
    assert '"outcome": "stale_fence"' in line


def test_a_line_says_the_same_without_the_fields_it_never_shows() -> None:
    """``fencegate serve`` stops logging finding the caller, thread and process
    of a record (logs.skip_unused_fields): no line showed them."""
    log = logging.getLogger("fencegate.test_logs")
    saved = (logging._srcfile, logging.logThreads, logging.logProcesses,
             logging.logMultiprocessing)

    lines: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            lines.append(JsonFormatter().format(record))

    def line() -> dict[str, object]:
        log.info("effect %s", "k", extra={"outcome": "succeeded", "fence": 3})
        out: dict[str, object] = json.loads(lines.pop())
        out.pop("ts")
        return out

    keep = Keep()
    log.addHandler(keep)
    log.setLevel(logging.INFO)
    before = line()
    try:
        skip_unused_fields()
        assert line() == before == {"level": "info", "logger": "fencegate.test_logs",
                                    "msg": "effect k", "outcome": "succeeded", "fence": 3}
    finally:
        log.removeHandler(keep)
        (logging._srcfile, logging.logThreads, logging.logProcesses,
         logging.logMultiprocessing) = saved
