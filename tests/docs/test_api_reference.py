"""The Python API reference (mkdocs.yml, `make docs`) builds strictly from
the docstrings, and covers what a worker imports."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_the_api_reference_builds_strictly_and_names_the_public_api(tmp_path: Path) -> None:
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-q",
                            "-d", str(tmp_path / "site")], cwd=ROOT, capture_output=True,
                           text=True, timeout=300)
    assert built.returncode == 0, built.stderr
    pages = {p.parent.name: p.read_text() for p in (tmp_path / "site").rglob("index.html")}
    for name in ("LeaseClient", "Lease", "Queue", "Worker", "RetryPolicy"):
        assert f'id="leases.{name}"' in pages["leases"], name
    for name in ("GatewayClient", "Result"):
        assert f'id="gateway.client.{name}"' in pages["gateway-client"], name
    for name in ("leases.errors.LeaseLost", "leases.errors.NoDatabase",
                 "gateway.client.FenceRejected", "gateway.client.GatewayUnreachable"):
        assert f'id="{name}"' in pages["errors"], name
