"""The email's build and its request summary, timed in one process:
``python -m bench.mime``.

2,000 builds (``mime.build_message``) and summaries (``summary.email_summary``)
of a small text email, each a key of its own, median of 7 rounds, in µs. No
database, no network: what the gateway spends on an email before its
admission. A/B: run it with ``PYTHONPATH`` at each checkout, alternating.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

from gateway.api import email_body
from gateway.effects import summary
from gateway.providers import mime
from gateway.providers.base import EmailCall

ROUNDS, CALLS = 7, 2000


def _median_us(fn: Callable[[int], object]) -> float:
    times = []
    for _ in range(ROUNDS):
        started = time.perf_counter()
        for i in range(CALLS):
            fn(i)
        times.append((time.perf_counter() - started) / CALLS * 1e6)
    return statistics.median(times)


def main() -> None:
    req = email_body.email_request({
        "from": "Agent <agent@example.com>", "to": ["a@example.com"],
        "subject": "Your invoice", "text": "hello " * 50, "headers": {"X-Campaign": "c1"}})

    def call(i: int) -> EmailCall:
        return EmailCall("agents", f"k{i}", "run:1", 7, email=req)

    build = _median_us(lambda i: mime.build_message(call(i), "X-Idem"))
    brief = _median_us(lambda i: summary.email_summary(call(i)))
    print(f"build_message {build:,.0f} µs, email_summary {brief:,.1f} µs "
          f"(median of {ROUNDS} rounds of {CALLS:,})")


if __name__ == "__main__":
    main()
