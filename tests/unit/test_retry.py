"""The queue's pure rules: retry decisions, backoff, error sanitising."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leases.retry import MAX_ERROR_LENGTH, RetryPolicy, sanitize_error


@given(attempt=st.integers(min_value=1, max_value=200), seed=st.integers())
def test_backoff_is_exponential_capped_and_jittered_within_the_upper_half(
    attempt: int, seed: int
) -> None:
    p = RetryPolicy(base_seconds=1, cap_seconds=600)
    step = min(600, 2.0 ** (attempt - 1))
    delay = p.backoff(attempt, random.Random(seed))
    assert step / 2 <= delay <= step


def test_backoff_grows_until_the_cap() -> None:
    p = RetryPolicy(base_seconds=1, cap_seconds=8)
    rng = random.Random(1)
    lows = [p.backoff(a, rng) for a in range(1, 8)]
    assert lows[0] <= 1 and 2 <= lows[3] <= 8 and lows[-1] <= 8


@given(attempt=st.integers(min_value=1, max_value=50),
       max_attempts=st.integers(min_value=1, max_value=50))
def test_the_last_attempt_is_never_retried(attempt: int, max_attempts: int) -> None:
    d = RetryPolicy().decide(attempt, max_attempts, random.Random(0))
    assert d.retry == (attempt < max_attempts)


def test_jitter_spreads_a_burst() -> None:
    p = RetryPolicy(base_seconds=10, cap_seconds=100)
    rng = random.Random(7)
    assert len({round(p.backoff(3, rng), 3) for _ in range(20)}) > 10


@pytest.mark.parametrize(("raw", "secret"), [
    ("connect to postgresql://app:s3cr3t@db:5432/x failed", "s3cr3t"),
    ("401 with Authorization: Bearer abc.def.ghi", "abc.def.ghi"),
    ("bad password=hunter2 for user", "hunter2"),
    ("api_key: 'zzz-top'", "zzz-top"),
    ("stripe said no to sk_live_1234567890abcdef", "1234567890abcdef"),
])
def test_secrets_never_reach_last_error(raw: str, secret: str) -> None:
    assert secret not in sanitize_error(RuntimeError(raw))


def test_errors_are_one_bounded_line_with_their_type() -> None:
    text = sanitize_error(ValueError("line one\nline two " + "x" * 5000))
    assert text.startswith("ValueError: line one line two")
    assert "\n" not in text and len(text) <= MAX_ERROR_LENGTH
