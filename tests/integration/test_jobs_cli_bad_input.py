"""Red team: ``fencegate jobs`` verbs given bad input answer a clear error,
never a traceback."""

from __future__ import annotations

import pytest

from tests.integration.test_cli import run

HUGE = "99999999999999999999"  # an integer, but past bigint


@pytest.mark.parametrize("argv", [
    ("jobs", "show", HUGE),
    ("jobs", "cancel", "mail", HUGE),
    ("jobs", "replay", "mail", HUGE),
    ("jobs", "list", "mail", "--limit", "-1"),
    ("jobs", "dead", "mail", "--limit", "-1"),
    ("jobs", "enqueue", "mail", "--delay", "1e300"),
    ("jobs", "enqueue", "mail", "--delay", "nan"),
    ("jobs", "enqueue", "mail", "--max-attempts", "0"),
    ("jobs", "enqueue", "mail", "--priority", HUGE),
    ("jobs", "enqueue", "mail", "--unique-key", "k", "--unique-for", "nan"),
    ("jobs", "enqueue", "mail", "--unique-key", "k", "--unique-for", "1e-320"),
    ("jobs", "cancel", "mail", "seven"),
    ("jobs", "cancel", "no spaces", "1"),
    ("jobs", "stats", "no spaces"),
])
def test_bad_input_gets_a_clear_error(dsn: str, argv: tuple[str, ...]) -> None:
    done = run(dsn, *argv)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode != 0
    assert done.stderr.strip(), "no word of what was wrong"


@pytest.mark.parametrize("seconds", ["1e-12", "1e-320"])
def test_a_unique_window_too_short_to_number_is_named(dsn: str, seconds: str) -> None:
    """The window's number (the epoch over the period) past bigint answered
    "bigint out of range", naming nothing the user gave."""
    done = run(dsn, "jobs", "enqueue", "mail", "--unique-key", "k", "--unique-for", seconds)
    assert done.returncode == 2 and "unique_for" in done.stderr, done.stderr
