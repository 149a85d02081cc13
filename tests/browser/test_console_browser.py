"""The console in a real browser: Debian's headless Chromium, driven by
Playwright for Python (`make console-check`). An operator logs in, sees a
zombie's rejection appear without reloading, finds effects, resolves an
unknown effect from its page (the confirmation box required) and replays a
dead job; every screen is photographed (docs/console.md shows them).
Nothing is loaded from outside the gateway, and no Content-Security-Policy
violation is reported."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from gateway.app import build_app
from gateway.dev.sinks import SmtpSink, WebhookSink
from gateway.state import GATEWAY
from leases import LeaseClient, Queue
from tests.browser.conftest import CHROMIUM
from tests.integration.conftest import API_KEY
from tests.support.console import OPERATOR_KEY, console_config, unknown_effect

#: waits for what the page shows; generous, as the test must not flake (not a measurement)
WAIT_MS = 30_000
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run"]


@pytest.fixture
def shots(tmp_path: Path) -> Path:
    folder = Path(os.environ.get("FENCEGATE_SCREENSHOTS") or tmp_path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
async def gateway(dsn: str, pool: asyncpg.Pool, smtp_sink: SmtpSink,
                  webhook_sink: WebhookSink) -> AsyncIterator[tuple[str, Any]]:
    app = build_app(console_config(smtp_sink.port, webhook_sink.port), dsn,
                    migrate_on_start=False)
    server = TestServer(app, host="127.0.0.1")
    await server.start_server()
    yield str(server.make_url("")).rstrip("/"), app
    await server.close()


async def _traffic(url: str, pool: asyncpg.Pool) -> tuple[Any, Any]:
    """Some history to look at: leases live and ended, emails sent, a zombie
    refused. Answers the zombie's lease and the one that superseded it."""
    leases = LeaseClient(pool=pool)
    async with aiohttp.ClientSession() as http:
        auth = {"Authorization": f"Bearer {API_KEY}"}
        body = {"from": "agent@example.com", "to": ["lead@example.com"], "subject": "Hi",
                "text": "..."}
        for n in range(1, 4):
            lease = await leases.claim(f"lead:{n}", ttl=600, owner=f"worker-{n}")
            assert lease is not None
            async with http.post(url + "/v1/email", json=body, headers={
                    **auth, "Fence-Resource": lease.resource, "Fence-Token": str(lease.fence),
                    "Idempotency-Key": f"welcome-{n}"}) as r:
                assert r.status == 200
        old = await leases.claim("run:nightly-report", ttl=0.2, owner="worker-a")
        assert old is not None
        await asyncio.sleep(0.3)
        new = await leases.claim("run:nightly-report", ttl=600, owner="worker-b")
        assert new is not None
    return old, new


async def _zombie_sends(url: str, old: Any) -> None:
    async with aiohttp.ClientSession() as http:
        async with http.post(url + "/v1/email", json={
                "from": "agent@example.com", "to": ["lead@example.com"], "subject": "Report",
                "text": "..."}, headers={
                "Authorization": f"Bearer {API_KEY}", "Fence-Resource": old.resource,
                "Fence-Token": str(old.fence), "Idempotency-Key": "report-zombie"}) as r:
            assert r.status == 412


async def test_an_operator_at_work(gateway: tuple[str, Any], pool: asyncpg.Pool,
                                   shots: Path) -> None:
    from playwright.async_api import async_playwright, expect

    url, app = gateway
    old, _ = await _traffic(url, pool)
    await unknown_effect(pool, "quote-7", past_deadline=True)
    q = Queue(LeaseClient(pool=pool), "outreach")
    job_id = await q.enqueue({"lead": 42, "template": "welcome", "api_key": "sk_live_123"},
                             max_attempts=1)
    await q.enqueue({"lead": 43, "template": "welcome"})
    [job] = await q.claim(limit=1)
    assert job.id == job_id
    await q.fail(job, "SMTP 550 5.1.1 mailbox unavailable")

    elsewhere: list[str] = []
    csp: list[str] = []
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = await browser.new_page(viewport={"width": 1360, "height": 860})
        page.on("request", lambda r: None if r.url.startswith((url, "data:", "blob:"))
                else elsewhere.append(r.url))
        page.on("console", lambda m: csp.append(m.text)
                if "Content Security Policy" in m.text else None)

        # log in
        await page.goto(url + "/console")
        await expect(page.get_by_label("API key")).to_be_visible()
        await page.screenshot(path=shots / "login.png")
        await page.get_by_label("API key").fill(OPERATOR_KEY)
        await page.get_by_role("button", name="Log in").click()
        await expect(page.get_by_role("heading", name="Leases")).to_be_visible()
        assert OPERATOR_KEY not in page.url
        assert await page.evaluate("document.cookie") == ""  # HttpOnly: no script reads it
        assert await page.evaluate("localStorage.length + sessionStorage.length") == 0
        await expect(page.get_by_text("run:nightly-report")).to_be_visible()
        await page.screenshot(path=shots / "leases.png", full_page=True)

        # a zombie's rejection appears, without a reload
        await page.get_by_role("link", name="Fence rejections").click()
        zombies = page.locator("#zombies")
        await expect(zombies.get_by_text("No zombie")).to_be_visible()
        await _zombie_sends(url, old)
        await expect(zombies.get_by_text("run:nightly-report")).to_be_visible(timeout=WAIT_MS)
        await expect(page.locator("rect.bar.stale_fence")).to_have_count(1)
        await page.screenshot(path=shots / "rejections.png", full_page=True)

        # find an effect, then resolve an unknown one from its page
        await page.get_by_role("link", name="Effects").click()
        await page.get_by_label("key starts with").fill("welcome-")
        await page.get_by_role("button", name="Find").click()
        await expect(page.locator("#found").get_by_text("agents/welcome-2")).to_be_visible()
        row = page.locator("#unknown tr", has_text="quote-7")
        await expect(row.get_by_text("timed out during DATA")).to_be_visible()
        await page.screenshot(path=shots / "effects.png", full_page=True)
        await row.get_by_role("link", name="Check and resolve…").click()
        await expect(page.locator("#attempts")).to_contain_text("timed out during DATA")
        await page.get_by_label("sent: the provider acted").check()
        await page.screenshot(path=shots / "effect.png", full_page=True)
        await page.get_by_role("button", name="Resolve").click()  # the box is not ticked
        assert await pool.fetchval("SELECT state FROM fencegate_effects "
                                   "WHERE idempotency_key = 'quote-7'") == "unknown"
        await page.get_by_label("I checked with the provider").check()
        await page.get_by_role("button", name="Resolve").click()
        await expect(page.get_by_role("status")).to_contain_text("Resolved as sent")
        await expect(page.locator("#resolutions")).to_contain_text("ops")
        assert await pool.fetchval("SELECT state FROM fencegate_effects "
                                   "WHERE idempotency_key = 'quote-7'") == "succeeded"

        # replay a dead job
        await page.get_by_role("link", name="Queues").click()
        dead = page.locator("#jobs tr", has_text="mailbox unavailable")
        await expect(dead).to_be_visible()
        await page.screenshot(path=shots / "queues.png", full_page=True)
        assert "sk_live_123" not in await page.content()  # the payload's secret, blanked
        await dead.get_by_label("the cause is fixed").check()
        await dead.get_by_role("button", name="Replay").click()
        await expect(page.get_by_role("status")).to_contain_text("Replayed")
        await expect(page.locator("#jobs").get_by_text("No dead job")).to_be_visible()
        assert (await q.stats()).get("dead", 0) == 0

        # the API reference, drawn by the vendored Redoc
        await page.goto(url + "/docs")
        await expect(page.get_by_text("Send one email through an email provider").first
                     ).to_be_visible(timeout=WAIT_MS)
        await page.screenshot(path=shots / "docs.png")
        await browser.close()

    assert elsewhere == [], elsewhere
    assert csp == [], csp
    assert app[GATEWAY].rejections is not None
