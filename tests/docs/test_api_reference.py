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


def test_every_public_name_a_worker_imports_has_a_docstring() -> None:
    """What leases exports and gateway.client defines, and their public
    methods and properties: each says what it does (the reference is built
    from these)."""
    import inspect

    import gateway.client as gc
    import leases

    names = [(f"leases.{n}", getattr(leases, n)) for n in leases.__all__]
    names += [(f"gateway.client.{n}", v) for n, v in vars(gc).items()
              if not n.startswith("_") and getattr(v, "__module__", "") == "gateway.client"]
    missing = []
    for name, obj in names:
        if not (obj.__doc__ or "").strip():
            missing.append(name)
        if not inspect.isclass(obj):
            continue
        for attr, value in vars(obj).items():
            if attr.startswith("_"):
                continue
            f = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
            if callable(f) and not (f.__doc__ or "").strip():
                missing.append(f"{name}.{attr}")
    assert missing == []
