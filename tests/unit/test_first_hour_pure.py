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
