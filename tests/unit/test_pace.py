"""The provider's pace (gateway/effects/pace.py): pure rules, the clocks as arguments."""

from __future__ import annotations

from email.utils import formatdate

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.config.presets import DEFAULT_PACE, HUBSPOT, RESEND, SENDGRID, SES
from gateway.effects.pace import (
    MAX_PAUSE_SECONDS,
    PAUSE_WITHOUT_HINT_SECONDS,
    Pauses,
    requested_pause,
    retry_after_seconds,
)

WALL = 1_764_494_284.0  # 2025-11-30T09:18:04Z


@pytest.mark.parametrize(("value", "seconds"), [
    ("2", 2.0), (" 120 ", 120.0), ("0", 0.0),
    (formatdate(WALL + 30, usegmt=True), 30.0),              # IMF-fixdate
    ("Sunday, 30-Nov-25 09:18:34 GMT", 30.0),                 # RFC 850
    ("Sun Nov 30 09:18:34 2025", 30.0),                       # asctime: GMT
    (formatdate(WALL - 30, usegmt=True), 0.0),                # in the past: now
    (None, None), ("", None), ("soon", None), ("-1", None), ("1.5e3", None),
])
def test_retry_after_is_seconds_or_an_http_date(value: str | None,
                                                seconds: float | None) -> None:
    assert retry_after_seconds(value, WALL) == seconds


def test_a_429_pauses_for_its_retry_after_first() -> None:
    headers = {"Retry-After": "3", "ratelimit-reset": "9"}
    assert requested_pause(headers, RESEND.pace, WALL) == 3.0


def test_without_retry_after_the_presets_reset_header_says_when() -> None:
    assert requested_pause({"ratelimit-reset": "4"}, RESEND.pace, WALL) == 4.0
    # SendGrid's X-RateLimit-Reset is an epoch
    assert requested_pause({"X-RateLimit-Reset": str(int(WALL) + 7)}, SENDGRID.pace,
                           WALL) == 7.0
    assert requested_pause({"X-RateLimit-Reset": str(int(WALL) - 7)}, SENDGRID.pace,
                           WALL) == 0.0


def test_headers_a_provider_does_not_send_are_not_read() -> None:
    """SES documents no Retry-After; HubSpot names no reset header."""
    assert requested_pause({"Retry-After": "30"}, SES.pace, WALL) == PAUSE_WITHOUT_HINT_SECONDS
    assert requested_pause({"X-RateLimit-Reset": "30"}, HUBSPOT.pace, WALL) == \
        PAUSE_WITHOUT_HINT_SECONDS
    assert requested_pause({"Retry-After": "30"}, DEFAULT_PACE, WALL) == 30.0


def test_a_429_that_says_nothing_pauses_a_moment_and_no_pause_is_endless() -> None:
    assert requested_pause({}, DEFAULT_PACE, WALL) == PAUSE_WITHOUT_HINT_SECONDS
    assert requested_pause({"Retry-After": "86400"}, DEFAULT_PACE, WALL) == MAX_PAUSE_SECONDS
    assert requested_pause({"Retry-After": "garbage"}, DEFAULT_PACE, WALL) == \
        PAUSE_WITHOUT_HINT_SECONDS


def test_a_pause_is_per_provider_and_ends() -> None:
    pauses = Pauses()
    assert pauses.pause("resend", 100.0, 2.0) == 2.0
    assert pauses.remaining("resend", 100.5) == 1.5
    assert pauses.remaining("postmark", 100.5) == 0.0
    assert pauses.remaining("resend", 102.0) == 0.0
    assert pauses.remaining("resend", 250.0) == 0.0


@given(st.lists(st.tuples(st.floats(0, 100), st.floats(0, 700)), max_size=20))
def test_a_pause_never_gets_shorter_and_counts_each_second_once(
        steps: list[tuple[float, float]]) -> None:
    pauses, now, end, total = Pauses(), 0.0, 0.0, 0.0
    for advance, seconds in steps:
        now += advance
        added = pauses.pause("p", now, seconds)
        assert added >= 0
        total += added
        new_end = now + pauses.remaining("p", now)
        assert new_end >= end - 1e-9 and new_end >= now + seconds - 1e-9
        end = max(end, new_end)
    # the seconds counted are the seconds paused, overlaps counted once
    assert total <= end + 1e-6
