"""Periodic schedules: which tick is due, and the key that makes it one job."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leases.errors import InvalidArgument
from leases.periodic import Schedule, due_tick, latest_tick, next_tick, tick_key, tick_of

UTC = dt.UTC
DAILY = Schedule("daily-backstop", "0 3 * * *", queue="backstop")
EVERY_5S = Schedule("fast", "* * * * * */5", queue="q")


def at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text).replace(tzinfo=UTC)


def test_the_latest_tick_is_at_or_before_now() -> None:
    assert latest_tick(DAILY, at("2026-12-02T03:00:00")) == at("2026-12-02T03:00:00")
    assert latest_tick(DAILY, at("2026-12-02T02:59:59.999")) == at("2026-12-01T03:00:00")
    assert latest_tick(DAILY, at("2026-12-02T15:30:00")) == at("2026-12-02T03:00:00")


def test_the_next_tick_is_strictly_after_now() -> None:
    assert next_tick(DAILY, at("2026-12-02T03:00:00")) == at("2026-12-03T03:00:00")
    assert next_tick(DAILY, at("2026-12-02T02:59:59.5")) == at("2026-12-02T03:00:00")


def test_a_sixth_field_is_seconds() -> None:
    assert latest_tick(EVERY_5S, at("2026-12-02T10:00:07.3")) == at("2026-12-02T10:00:05")
    assert next_tick(EVERY_5S, at("2026-12-02T10:00:07.3")) == at("2026-12-02T10:00:10")


def test_ticks_are_read_in_the_schedule_s_time_zone() -> None:
    paris = Schedule("paris", "0 9 * * *", queue="q", timezone="Europe/Paris")
    # 09:00 in Paris is 08:00 UTC in winter, 07:00 UTC in summer
    assert latest_tick(paris, at("2026-12-02T12:00:00")) == at("2026-12-02T08:00:00")
    assert latest_tick(paris, at("2026-07-02T12:00:00")) == at("2026-07-02T07:00:00")


def test_after_downtime_only_the_latest_missed_tick_is_due() -> None:
    minutely = Schedule("m", "* * * * *", queue="q")
    # ten minutes down: the ticks at 10:01 ... 10:09 are never due, 10:10 is
    assert due_tick(minutely, at("2026-12-02T10:10:30")) == at("2026-12-02T10:10:00")


def test_a_tick_older_than_catch_up_is_skipped() -> None:
    strict = Schedule("d", "0 3 * * *", queue="q", catch_up=60)
    assert due_tick(strict, at("2026-12-02T03:00:59")) == at("2026-12-02T03:00:00")
    assert due_tick(strict, at("2026-12-02T03:01:01")) is None


def test_no_tick_older_than_the_retention_is_due() -> None:
    """A finished tick's job keeps its dedupe key only for the retention: an
    older tick could have lost its row, and would be enqueued a second time."""
    monthly = Schedule("monthly", "0 0 1 * *", queue="q")
    assert due_tick(monthly, at("2026-12-05T00:00:00"), retention_seconds=7 * 86400) \
        == at("2026-12-01T00:00:00")
    assert due_tick(monthly, at("2026-12-09T00:00:00"), retention_seconds=7 * 86400) is None


def test_the_tick_key_names_the_schedule_and_the_tick_and_reads_back() -> None:
    key = tick_key("daily-backstop", at("2026-12-02T03:00:00"))
    assert key == "periodic:daily-backstop:2026-12-02T03:00:00Z"
    assert tick_of(key) == ("daily-backstop", at("2026-12-02T03:00:00"))
    assert tick_of("lead-42") is None and tick_of(None) is None
    assert tick_of("periodic:x:not-a-time-at-all-here") is None


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"cron": "every day"}, "not a cron expression"),
    ({"cron": "61 * * * *"}, "not a cron expression"),
    ({"name": "no spaces"}, "schedule names"),
    ({"queue": "bad queue"}, "queue names"),
    ({"timezone": "Mars/Olympus"}, "no time zone"),
    ({"catch_up": -1}, "catch_up"),
    ({"max_attempts": 0}, "max_attempts"),
])
def test_a_bad_schedule_is_refused_when_declared(kwargs: dict[str, object], says: str) -> None:
    fields: dict[str, object] = {"name": "s", "cron": "* * * * *", "queue": "q", **kwargs}
    with pytest.raises(InvalidArgument, match=says):
        Schedule(**fields)  # type: ignore[arg-type]


instants = st.datetimes(min_value=dt.datetime(2020, 1, 1), max_value=dt.datetime(2035, 1, 1),
                        timezones=st.just(UTC))


@given(instants, st.sampled_from(["* * * * *", "*/7 * * * *", "0 3 * * *", "30 2 * * 1",
                                  "* * * * * */10", "0 0 1 * *"]))
def test_now_lies_between_the_latest_tick_and_the_next(now: dt.datetime, cron: str) -> None:
    s = Schedule("p", cron, queue="q")
    last = latest_tick(s, now)
    assert last <= now < next_tick(s, now)
    assert next_tick(s, last) == next_tick(s, now), "a tick between the latest and now"
    assert last.microsecond == 0
