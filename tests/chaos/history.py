"""The history of a chaos run: JSON lines, one file per process, read back as one."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any


class Recorder:
    """Appends events to ``<dir>/<name>.jsonl``, flushed at once: a process may
    be killed at any moment and must lose nothing it recorded."""

    def __init__(self, directory: Path, name: str) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(directory / f"{name}.{os.getpid()}.jsonl",
                           os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)

    def record(self, event: str, **fields: Any) -> None:
        line = json.dumps({"ev": event, "wall": time.time(), **fields}) + "\n"
        os.write(self._fd, line.encode())


def read(directory: Path) -> list[dict[str, Any]]:
    events = []
    for path in sorted(directory.glob("*.jsonl")):
        for line in path.read_text().splitlines():
            if line.strip():
                try:
                    events.append(json.loads(line))
                except ValueError:
                    continue  # a line cut short by SIGKILL
    events.sort(key=lambda e: e["wall"])
    return events
