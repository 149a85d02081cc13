"""The playground of `fencegate dev` in a real browser (`make console-check`):
an operator presses the buttons and watches the jobs move through their
states without reloading: a charge done once however often it is
duplicated, a flaky job retried to completion, a poison job dead, then
fixed and replayed. Nothing is loaded from elsewhere; no CSP violation."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from gateway.dev.playground import PATH
from gateway.dev.stack import DevStack, dev_stack
from leases import database
from tests.browser.conftest import CHROMIUM
from tests.browser.test_console_browser import FLAGS, WAIT_MS


@pytest.fixture
async def dev(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              ) -> AsyncIterator[DevStack]:
    monkeypatch.setenv(database.DATABASE_URL_ENV, dsn)
    monkeypatch.setenv(database.HOME_ENV, str(tmp_path))
    async with dev_stack(gateway_port=0, own_files=False, playground=True) as stack:
        yield stack


async def test_the_playground_live(dev: DevStack, tmp_path: Path) -> None:
    from playwright.async_api import async_playwright, expect

    shots = Path(os.environ.get("FENCEGATE_SCREENSHOTS") or tmp_path)
    elsewhere: list[str] = []
    csp: list[str] = []
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=FLAGS)
        page = await browser.new_page(viewport={"width": 1360, "height": 900})
        page.on("request", lambda r: None if r.url.startswith((dev.url, "data:", "blob:"))
                else elsewhere.append(r.url))
        page.on("console", lambda m: csp.append(m.text)
                if "Content Security Policy" in m.text else None)
        await page.goto(dev.url + "/console")
        await page.get_by_label("API key").fill(dev.api_key)
        await page.get_by_role("button", name="Log in").click()
        await page.goto(dev.url + PATH)
        await expect(page.get_by_role("heading", name="Playground")).to_be_visible()

        await page.get_by_role("button", name="Enqueue a charge").click()
        charge = page.locator("#jobs tr", has_text="charge order")
        await expect(charge).to_contain_text("completed", timeout=WAIT_MS)
        await page.get_by_role("button", name="Duplicate it").click()
        await expect(page.get_by_role("status")).to_contain_text("nothing was added")
        await expect(page.locator("#jobs tr[data-job]")).to_have_count(1)

        await page.get_by_role("button", name="A flaky job").click()
        await page.get_by_role("button", name="A poison job").click()
        # no reload from here on: the page refreshes itself
        flaky = page.locator("#jobs tr", has_text="flaky")
        poison = page.locator("#jobs tr", has_text="poison")
        await expect(flaky).to_contain_text("completed", timeout=WAIT_MS)
        await expect(flaky).to_contain_text("3/3")
        await expect(poison).to_contain_text("dead", timeout=WAIT_MS)
        await expect(poison).to_contain_text("is not a number of cents")
        await expect(page.locator("#charged")).to_contain_text("1 charge request")
        await page.screenshot(path=shots / "playground.png", full_page=True)

        await page.get_by_role("button", name="Fix and replay the dead letters").click()
        await expect(page.get_by_role("status")).to_contain_text("The bug is fixed")
        await expect(poison).to_contain_text("completed", timeout=WAIT_MS)
        await expect(page.locator("#events")).to_contain_text("replay the dead letters")
        await browser.close()
    assert elsewhere == [], elsewhere
    assert csp == [], csp
