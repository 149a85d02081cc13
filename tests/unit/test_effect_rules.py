"""Pure rules of the effect path and the schema: deadlines, compatibility,
redaction, the path filter, the log format."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.api import parsing
from gateway.api.problems import Problem
from gateway.effects.deadline import SEND_MARGIN_SECONDS, Deadline
from leases import database
from leases.logs import JsonFormatter
from leases.migrate import SchemaState, usable


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@given(at=st.floats(0, 1e6), now=st.floats(0, 1e6), limit=st.floats(0, 3600))
def test_a_deadline_bounds_every_wait_and_refuses_late_starts(
    at: float, now: float, limit: float,
) -> None:
    d = Deadline(at, Clock(now))
    assert 0 <= d.bound(limit) <= limit
    assert d.bound(limit) <= max(0.0, at - now) + 1e-9
    assert d.can_start() == (at - now > SEND_MARGIN_SECONDS)


@pytest.mark.parametrize(("found", "breaking", "known", "ok"), [
    (4, 0, 4, True),     # same
    (5, 0, 4, True),     # newer, additive: a rolling upgrade
    (5, 5, 4, False),    # newer, past a breaking migration
    (5, 3, 4, True),     # a breaking migration this code already knows
    (3, 0, 4, False),    # older: run fencegate migrate
])
def test_schema_compatibility(found: int, breaking: int, known: int, ok: bool) -> None:
    assert (usable(SchemaState(found, breaking), known) is None) is ok


@pytest.mark.parametrize("dsn", [
    "postgresql://u:s3cret@h:5432/db",
    "postgresql://u@h/db?password=s3cret",
    "postgresql://u@h/db?sslmode=require&PASSWORD=s3cret&sslpassword=s3cret",
])
def test_a_dsn_in_a_log_line_never_shows_its_password(dsn: str) -> None:
    shown = database.redacted(dsn)
    assert "s3cret" not in shown and "***" in shown


@pytest.mark.parametrize("path", [
    "..;/admin", "a/..;/b", "a;b", "...", "a/.../b", "a/.. /b", "a/ /b", "a/%09/b", "../x",
    "a/%2e%2e/b",
])
def test_paths_that_some_server_would_climb_out_with_are_refused(path: str) -> None:
    with pytest.raises(Problem) as refused:
        parsing.provider_path(path)
    assert refused.value.code == "bad_request"


@pytest.mark.parametrize("path", ["contacts/7/notes", "a.b/c-d_e", "v1/x%20y", "a//b"])
def test_ordinary_paths_pass(path: str) -> None:
    assert parsing.provider_path(path) == path


def test_an_unhandled_error_is_logged_with_its_message_and_traceback() -> None:
    try:
        raise RuntimeError("the ledger broke")
    except RuntimeError as exc:
        record = logging.LogRecord("fencegate", logging.ERROR, __file__, 1,
                                   "unhandled error: %s", (exc,), __import__("sys").exc_info())
    line = JsonFormatter().format(record)
    assert "the ledger broke" in line and "Traceback" in line and '"error": "RuntimeError"' \
        in line
