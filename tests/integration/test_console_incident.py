"""The console as an operator resolving an incident uses it (issue 25): no
secret on any page, a page per effect with what the ledger keeps, findable
resolutions naming the operator, filters and pages on every list, a
confirmation before each action, legible times and messages."""

from __future__ import annotations

from leases import LeaseClient, Queue
from tests.integration.test_console import CACHE, Console, console  # noqa: F401

SECRET = "sk_live_123"


async def test_a_dead_jobs_payload_and_error_show_no_secret(console: Console) -> None:
    await console.login()
    q = Queue(LeaseClient(pool=console.pool), "crm")
    await q.enqueue({"to": "lead@example.com", "api_key": SECRET,
                     "crm": {"auth": {"token": "t0ps3cret"}}}, max_attempts=1)
    [job] = await q.claim()
    assert await q.fail(job, f"RuntimeError: CRM refused (api_key={SECRET})") == "dead"
    _, html, _ = await console.page("/console/queues")
    dead = html[html.index('id="dead"'):]
    assert SECRET not in html and "t0ps3cret" not in html
    assert "lead@example.com" in dead  # the rest of the payload is shown
    assert "CRM refused (api_key=***)" in dead  # the parenthesis is kept
