"""The browser tests run only under `make console-check`, which installs
Debian's chromium and Playwright for Python (never a browser download) and
sets FENCEGATE_BROWSER=1."""

from __future__ import annotations

import os

import pytest

from tests.integration.conftest import smtp_sink, webhook_sink

__all__ = ["CHROMIUM", "smtp_sink", "webhook_sink"]  # the sinks are fixtures

CHROMIUM = os.environ.get("FENCEGATE_CHROMIUM", "/usr/bin/chromium")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    if os.environ.get("FENCEGATE_BROWSER") == "1":
        return
    skip = pytest.mark.skip(reason="a real browser: run `make console-check`")
    for item in items:
        if "tests/browser/" in str(item.path).replace(os.sep, "/"):
            item.add_marker(skip)
