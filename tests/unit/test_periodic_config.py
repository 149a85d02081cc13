"""Schedules declared in TOML: read whole, or refused naming file, table and key."""

from __future__ import annotations

import pytest

from leases.errors import InvalidArgument
from leases.periodic import Schedule
from leases.periodic_cli import schedules_from_toml


def test_schedules_are_read_with_their_options() -> None:
    text = """
[[schedules]]
name = "daily-backstop"
cron = "0 3 * * *"
queue = "backstop"
payload = { sweep = "unsent-quotes" }
catch_up = 3600

[[schedules]]
name = "heartbeat"
cron = "*/10 * * * * *"
queue = "beats"
timezone = "Europe/Paris"
"""
    assert schedules_from_toml(text, "s.toml") == [
        Schedule("daily-backstop", "0 3 * * *", "backstop", {"sweep": "unsent-quotes"},
                 catch_up=3600),
        Schedule("heartbeat", "*/10 * * * * *", "beats", timezone="Europe/Paris")]


@pytest.mark.parametrize(("text", "says"), [
    ("[[schedules]\n", "s.toml: not TOML"),
    ("[server]\nport = 1\n", "s.toml: no [[schedules]] table"),
    ('[[schedules]]\nname = "a"\nqueue = "q"\n', "s.toml, schedule 1: cron is missing"),
    ('[[schedules]]\nname = "a"\ncron = "* * * * *"\nqueue = "q"\nevery = 5\n',
     "s.toml, schedule 1: unknown key 'every'"),
    ('[[schedules]]\nname = "a"\ncron = "* * * * *"\nqueue = "q"\ncatch_up = "1h"\n',
     "catch_up must be a number"),
    ('[[schedules]]\nname = "a"\ncron = "* * * * *"\nqueue = "q"\npriority = 1.5\n',
     "priority must be int"),
    ('[[schedules]]\nname = "a"\ncron = "daily"\nqueue = "q"\n',
     "s.toml, schedule 1: schedule a: 'daily' is not a cron expression"),
])
def test_a_bad_file_is_refused_saying_where(text: str, says: str) -> None:
    with pytest.raises(InvalidArgument, match=says.replace("[", r"\[")):
        schedules_from_toml(text, "s.toml")
