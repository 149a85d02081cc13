"""The console's playground in dev mode, over HTTP: the buttons drive the
job platform's scenario, and the page shows the jobs' states."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import asyncpg
import pytest

from gateway.dev.playground import PATH
from gateway.dev.stack import DevStack, dev_stack
from leases import database
from tests.support.waiting import until


@pytest.fixture
async def dev(dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
              ) -> AsyncIterator[DevStack]:
    monkeypatch.setenv(database.DATABASE_URL_ENV, dsn)
    monkeypatch.setenv(database.HOME_ENV, str(tmp_path))
    async with dev_stack(gateway_port=0, own_files=False, playground=True) as stack:
        yield stack


@pytest.fixture
async def browser(dev: DevStack) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(cookie_jar=aiohttp.CookieJar(unsafe=True)) as http:
        async with http.post(dev.url + "/console/login", data={"api_key": dev.api_key},
                             headers={"Origin": dev.url}) as r:
            assert r.status == 200, await r.text()
        yield http


async def _page(http: aiohttp.ClientSession, dev: DevStack) -> str:
    async with http.get(dev.url + PATH) as r:
        assert r.status == 200
        return await r.text()


async def _press(http: aiohttp.ClientSession, dev: DevStack, action: str) -> str:
    csrf = re.search(r'name="csrf" value="([^"]+)"', await _page(http, dev))
    assert csrf is not None
    async with http.post(f"{dev.url}{PATH}/{action}", data={"csrf": csrf.group(1)},
                         headers={"Origin": dev.url}, allow_redirects=False) as r:
        assert r.status == 303
        return r.headers["Location"]


def _states(html: str) -> dict[int, str]:
    return {int(i): s for i, s in re.findall(r'data-job="(\d+)" data-state="(\w+)"', html)}


async def test_the_buttons_charge_once_retry_and_replay(dev: DevStack, pool: asyncpg.Pool,
                                                        browser: aiohttp.ClientSession) -> None:
    assert (await _press(browser, dev, "duplicate")).endswith("notice=no_charge")
    assert (await _press(browser, dev, "charge")).endswith("notice=charge")
    assert (await _press(browser, dev, "duplicate")).endswith("notice=duplicated")
    await _press(browser, dev, "flaky")
    await _press(browser, dev, "poison")

    async def settled() -> bool:
        states = sorted(_states(await _page(browser, dev)).values())
        return states == ["completed", "completed", "dead"]

    await until(settled, "the charge and the flaky job done, the poison job dead")
    html = await _page(browser, dev)
    assert len(_states(html)) == 3, "the duplicate added no job"
    assert "is not a number of cents" in html
    assert re.search(r"received <strong>1</strong> charge request", html)
    assert "deduplicated, still job" in html
    assert (await _press(browser, dev, "replay")).endswith("notice=replayed")

    async def all_done() -> bool:
        return set(_states(await _page(browser, dev)).values()) == {"completed"}

    await until(all_done, "the replayed poison job to complete")
    flaky = await pool.fetchval("SELECT attempts FROM fencegate_jobs "
                                "WHERE payload->>'kind' = 'flaky'")
    assert flaky == 3


async def test_an_action_without_the_csrf_token_is_refused(
        dev: DevStack, pool: asyncpg.Pool, browser: aiohttp.ClientSession) -> None:
    async with browser.post(f"{dev.url}{PATH}/charge", data={"csrf": "forged"},
                            headers={"Origin": dev.url}, allow_redirects=False) as r:
        assert r.headers["Location"].endswith("notice=refused")
    assert await pool.fetchval("SELECT count(*) FROM fencegate_jobs") == 0


async def test_the_playground_is_for_operators_and_dev_mode_only(dsn: str, tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(database.DATABASE_URL_ENV, dsn)
    monkeypatch.setenv(database.HOME_ENV, str(tmp_path))
    async with dev_stack(gateway_port=0, own_files=False, playground=True) as dev, \
            aiohttp.ClientSession() as http:
        async with http.get(dev.url + PATH, allow_redirects=False) as r:
            assert r.status == 303 and r.headers["Location"] == "/console/login"
    async with dev_stack(gateway_port=0, own_files=False) as served, \
            aiohttp.ClientSession() as http:
        async with http.get(served.url + PATH, allow_redirects=False) as r:
            assert r.status == 404
