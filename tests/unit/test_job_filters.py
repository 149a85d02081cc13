"""Reading job filters: a bad one is refused by name, before any SQL."""

from __future__ import annotations

import datetime as dt

import pytest

from leases.search import (
    BadFilter,
    JobFilter,
    PayloadCondition,
    parse_payload,
    parse_time,
    states_of,
)

NOW = dt.datetime(2026, 12, 2, 12, 0, tzinfo=dt.UTC)


@pytest.mark.parametrize(("text", "path", "value"), [
    ("customer.id=42", ("customer", "id"), 42),
    ("plan=pro", ("plan",), "pro"),
    ('code="42"', ("code",), "42"),
    ("paid=true", ("paid",), True),
    ("note=null", ("note",), None),
    ("items.0.sku=A-1", ("items", "0", "sku"), "A-1"),
    ("expr=a=b", ("expr",), "a=b"),
])
def test_a_payload_filter_is_a_path_and_a_json_value(text: str, path: tuple[str, ...],
                                                      value: object) -> None:
    assert parse_payload(text) == PayloadCondition(path, value)


@pytest.mark.parametrize("text", ["customer.id", "=42", "a..b=1", ".a=1"])
def test_a_payload_filter_without_a_path_or_a_value_is_refused(text: str) -> None:
    with pytest.raises(BadFilter, match="payload filter"):
        parse_payload(text)


def test_times_are_rfc3339_or_an_age() -> None:
    assert parse_time("2026-12-01T09:00:00Z", NOW) == dt.datetime(2026, 12, 1, 9, tzinfo=dt.UTC)
    assert parse_time("2026-12-01T09:00:00", NOW) == dt.datetime(2026, 12, 1, 9, tzinfo=dt.UTC)
    assert parse_time("15m", NOW) == NOW - dt.timedelta(minutes=15)
    assert parse_time("7d", NOW) == NOW - dt.timedelta(days=7)
    with pytest.raises(BadFilter, match="an age like 15m"):
        parse_time("yesterday", NOW)


@pytest.mark.parametrize(("kwargs", "says"), [
    ({"queue": "no spaces"}, "queue names"),
    ({"dedupe_key": "x" * 256}, "dedupe key: 1 to 255"),
    ({"since": NOW, "until": NOW}, "since must be before until"),
    ({"since": dt.datetime(2026, 1, 1)}, "time zone"),
    ({"states": ()}, "at least one"),
    ({"time_field": "updated"}, "time field"),
])
def test_a_bad_filter_says_which_and_why(kwargs: dict[str, object], says: str) -> None:
    with pytest.raises(BadFilter, match=says):
        JobFilter(**kwargs)  # type: ignore[arg-type]


def test_the_states_are_read_from_the_schema_s_check() -> None:
    definition = ("CHECK ((state = ANY (ARRAY['queued'::text, 'claimed'::text, "
                  "'completed'::text, 'dead'::text, 'cancelled'::text])))")
    assert states_of([definition]) == ("queued", "claimed", "completed", "dead", "cancelled")
