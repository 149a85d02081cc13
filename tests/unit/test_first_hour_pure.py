"""Pure rules of issue 13: how fences and times are shown, the client role."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway import config as gconfig
from gateway.dev.demo import short_fences
from gateway.errors import ConfigError
from leases import formats


def test_short_fences_leave_out_the_shared_digits() -> None:
    assert short_fences(1764496512345678, 1764496514012345) == ["…512 345 678",
                                                                "…514 012 345"]
    assert short_fences(1764496512345678, 1764496512345679) == ["…345 678", "…345 679"]
    assert short_fences(999, 1000) == ["999", "1 000"]  # not the same length: whole


@given(st.lists(st.integers(10**15, 10**16 - 1), min_size=2, max_size=4))
def test_short_fences_compare_as_the_fences_do(fences: list[int]) -> None:
    shown = short_fences(*fences)
    digits = [s.lstrip("…").replace(" ", "") for s in shown]
    assert len({len(d) for d in digits}) == 1  # side by side, the same width
    for (a, sa), (b, sb) in zip(zip(fences, digits, strict=True),
                                zip(fences[1:], digits[1:], strict=True), strict=False):
        assert (a < b) == (sa < sb) and (a == b) == (sa == sb)


def test_one_timestamp_format() -> None:
    t = dt.datetime(2025, 11, 30, 10, 18, 4, 123999, tzinfo=dt.timezone(dt.timedelta(hours=1)))
    assert formats.timestamp(t) == "2025-11-30T09:18:04.123Z"
    assert formats.text({"at": t}) == '{"at": "2025-11-30T09:18:04.123Z"}'
    assert formats.text(None) == ""


def _client(**extra: object) -> dict[str, object]:
    return {"name": "ops", "key_sha256": "0" * 64, "resources": ["*"], **extra}


def test_the_operator_role() -> None:
    assert gconfig.parse({"clients": [_client()]}).clients[0].role == "worker"
    assert gconfig.parse({"clients": [_client(role="operator")]}).clients[0].role == "operator"
    with pytest.raises(ConfigError, match=r"clients\[0\]\.role: must be"):
        gconfig.parse({"clients": [_client(role="admin")]}, "gw.toml")


def test_the_rejections_chart_stacks_each_minute_by_reason() -> None:
    from gateway.console.screens import CHART_HEIGHT, chart

    now = dt.datetime(2025, 11, 30, 9, 30, 30, tzinfo=dt.UTC)
    minute = now.replace(second=0)
    rows = [{"minute": minute, "reason": "stale_fence", "rejections": 3},
            {"minute": minute, "reason": "no_lease", "rejections": 1},
            {"minute": minute - dt.timedelta(minutes=90), "reason": "stale_fence",
             "rejections": 9}]  # outside the hour: left out
    drawn = chart(rows, now.timestamp())
    assert drawn["peak"] == 4 and drawn["end"] == "09:30" and drawn["start"] == "08:31"
    bars = drawn["bars"]
    assert [b["reason"] for b in bars] == ["no_lease", "stale_fence"]
    assert sum(b["height"] for b in bars) == CHART_HEIGHT  # the peak fills the chart
    assert bars[1]["y"] == 0.0 and bars[0]["y"] == bars[1]["height"]


def test_the_rejection_buffer_is_bounded() -> None:
    from gateway.effects import rejections

    log = rejections.RejectionLog(None)  # type: ignore[arg-type]  # never written here
    for n in range(rejections.MAX_BUFFERED + 5):
        log.note("agents", "mail", "stale_fence", "run:1", n + 1, n + 2, f"k{n}")
    assert len(log._buffer) == rejections.MAX_BUFFERED and log.dropped == 5
