"""Every Python, shell and JavaScript snippet of README.md and docs/ runs as
written, against a real gateway (its SMTP and webhook sinks) and a fresh
PostgreSQL database, as a user would paste it into a file. TOML snippets must
parse. A snippet that cannot run here (it starts a long-running server, needs
a Kubernetes cluster) is marked on the line before its fence:
``<!-- not run: why -->``; the reason is required.

The snippets find their world in the variables `fencegate dev` prints: ``FG``,
``FG_KEY`` and ``FENCEGATE_DATABASE_URL``; ``fencegate`` is on ``PATH``."""

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from leases import database
from tests.integration.conftest import API_KEY, Gw
from tests.support.snippets import DOCUMENTS, ROOT, RUNNERS, SNIPPETS, Snippet


def test_every_document_is_read_and_skips_say_why() -> None:
    assert len(SNIPPETS) > 10
    langs = {s.lang for s in SNIPPETS if s.not_run is None}
    assert {"python", "sh", "js"} <= langs
    for path in DOCUMENTS:  # a marker that names no reason is not a marker: it is caught here
        assert "<!-- not run -->" not in path.read_text(), path


@pytest.mark.parametrize("snippet", SNIPPETS, ids=lambda s: s.name)
async def test_snippet_runs_as_written(snippet: Snippet, gw: Gw, dsn: str,
                                       tmp_path: Path) -> None:
    if snippet.not_run is not None:
        pytest.skip(f"not run: {snippet.not_run}")
    kind = RUNNERS[snippet.lang]
    if kind == "toml":
        tomllib.loads(snippet.code)
        return
    if kind == "mjs" and shutil.which("node") is None:
        pytest.skip("node is not installed")
    script = tmp_path / f"snippet.{kind}"
    script.write_text(snippet.code)
    command = {"py": [sys.executable, str(script)], "sh": ["bash", "-euo", "pipefail", str(script)],
               "mjs": ["node", str(script)]}[kind]
    env = {**os.environ, "FG": gw.url, "FG_KEY": API_KEY, database.DATABASE_URL_ENV: dsn,
           database.HOME_ENV: str(tmp_path / ".fencegate"), "PYTHONPATH": str(ROOT),
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    ran = await asyncio.to_thread(
        subprocess.run, command, cwd=tmp_path, env=env, capture_output=True, text=True,
        timeout=90)
    assert ran.returncode == 0, f"{snippet.name} failed:\n{ran.stdout}\n{ran.stderr}"
    # each recipe that sends sends one email, however often it tries (the
    # receiver's recipe receives)
    if "recipes" in snippet.path.parts and snippet.path.name != "webhook-receiver.md":
        assert len(gw.smtp.deliveries) == 1, snippet.name
