"""The console's login throttle, as a pure policy (the clock an argument)."""

from __future__ import annotations

from gateway.console.throttle import (
    OVERALL_FAILURES,
    PER_SOURCE_FAILURES,
    WINDOW_SECONDS,
    LoginThrottle,
)


def test_a_source_is_throttled_after_its_failures_until_the_window_passes() -> None:
    t = LoginThrottle()
    for i in range(PER_SOURCE_FAILURES):
        assert t.wait("10.0.0.1", 100.0 + i) == 0
        t.failed("10.0.0.1", 100.0 + i)
    left = t.wait("10.0.0.1", 110.0)
    assert left == WINDOW_SECONDS - 10.0  # until the first failure leaves the window
    assert t.wait("10.0.0.2", 110.0) == 0  # another source is not
    assert t.wait("10.0.0.1", 100.0 + WINDOW_SECONDS) == 0


def test_a_success_clears_its_source() -> None:
    t = LoginThrottle()
    for _ in range(PER_SOURCE_FAILURES - 1):
        t.failed("a", 1.0)
    t.succeeded("a")
    t.failed("a", 2.0)
    assert t.wait("a", 2.0) == 0


def test_failures_from_many_sources_throttle_everyone() -> None:
    t = LoginThrottle()
    for i in range(OVERALL_FAILURES):
        source = f"10.1.{i // 250}.{i % 250}"
        assert t.wait(source, 5.0) == 0
        t.failed(source, 5.0)
    assert t.wait("192.0.2.1", 5.0) == WINDOW_SECONDS
    assert t.wait("192.0.2.1", 5.0 + WINDOW_SECONDS) == 0


def test_what_it_remembers_is_bounded() -> None:
    t = LoginThrottle()
    for i in range(100_000):
        if t.wait(f"s{i}", float(i)) == 0:
            t.failed(f"s{i}", float(i))
    assert len(t.sources) <= OVERALL_FAILURES + 1
    assert len(t.overall) <= OVERALL_FAILURES
