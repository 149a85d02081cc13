"""Red team: a schedule's latest tick across a daylight saving change.

When New York's clocks go back (2026-11-01, 02:00 EDT -> 01:00 EST), croniter's
get_prev read the repeated hour as its first instance: at 06:00 UTC the
"latest tick" of a daily 01:30 job went back to the day before, and of an
every-15-minutes job to 05:00 UTC, while next_tick counts both instances.
Latest and next must agree: no tick lies between the latest and now."""

from __future__ import annotations

import datetime as dt

import pytest

from leases.periodic import Schedule, latest_tick, next_tick

UTC = dt.UTC


@pytest.mark.parametrize(("cron", "zone", "start"), [
    ("30 1 * * *", "America/New_York", "2026-11-01T04:00:00"),
    ("*/15 * * * *", "America/New_York", "2026-11-01T04:00:00"),
    ("0 * * * *", "Europe/Berlin", "2026-10-24T23:00:00"),
    ("30 2 * * *", "America/New_York", "2026-03-08T05:00:00"),
    ("* * * * * */20", "Europe/Berlin", "2026-10-25T00:30:00"),
])
def test_no_tick_lies_between_the_latest_tick_and_now(cron: str, zone: str,
                                                        start: str) -> None:
    schedule = Schedule("dst", cron, queue="q", timezone=zone)
    first = dt.datetime.fromisoformat(start).replace(tzinfo=UTC)
    for minute in range(0, 4 * 60, 5):
        now = first + dt.timedelta(minutes=minute)
        latest = latest_tick(schedule, now)
        assert latest <= now < next_tick(schedule, now)
        assert next_tick(schedule, latest) > now, (now, latest)
