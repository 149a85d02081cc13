"""The request as sent, on an effect's console page (issue 25): an operator
about to resolve an unknown effect checks with the provider first, so the
page shows what was sent (recipients and subject, or method and path), and
never a body, a header's value or a secret in a query string, neither on
the page nor in the ledger's row."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import AsyncIterator
from typing import Any

import asyncpg
import pytest

from gateway.dev.sinks import SmtpSink, WebhookSink
from gateway.effects import fingerprint
from gateway.ledger import Ledger, new_attempt
from leases import Database, Lease, LeaseClient
from tests.integration.conftest import API_KEY
from tests.support.console import Console, open_console
from tests.support.waiting import until

SECRET = "sk_live_123"
BODY_TEXT = "the-body-text-is-never-kept"
HEADER_VALUE = "a-header-value-never-kept"


@pytest.fixture
async def console(dsn: str, pool: asyncpg.Pool, smtp_sink: SmtpSink,
                  webhook_sink: WebhookSink) -> AsyncIterator[Console]:
    async with open_console(dsn, pool, smtp_sink, webhook_sink) as c:
        yield c


def _headers(lease: Lease, key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}", "Fence-Resource": lease.resource,
            "Fence-Token": str(lease.fence), "Idempotency-Key": key}


async def _send(console: Console, method: str, path: str, headers: dict[str, str],
                **kw: Any) -> int:
    async with console.http.request(method, console.url + path, headers=headers, **kw) as r:
        await r.read()
        return r.status


async def _row(console: Console, key: str) -> str:
    """The effect's whole ledger row, as text, once its end is recorded."""
    rows: list[asyncpg.Record | None] = []

    async def recorded() -> bool:  # the end is written behind the answer
        rows.append(await console.pool.fetchrow(
            "SELECT state, to_jsonb(e)::text AS whole FROM fencegate_effects e "
            "WHERE client = 'agents' AND idempotency_key = $1", key))
        return rows[-1] is not None and rows[-1]["state"] != "in_flight"

    await until(recorded, f"{key}: its end recorded")
    whole: str = rows[-1]["whole"]  # type: ignore[index]
    return whole


async def test_an_emails_page_shows_its_addresses_subject_and_sizes(console: Console,
                                                                    ) -> None:
    """from, to, cc, bcc, subject, attachment names and sizes, the body's
    size and the Message-ID to look for at the provider; not the body, not
    its headers' values, and a secret in the subject blanked."""
    await console.login()
    lease = await LeaseClient(pool=console.pool).claim("run:sent-mail", ttl=60, owner="w")
    assert lease is not None
    email = {"from": "agent@example.com", "to": ["lead@example.com", "boss@example.com"],
             "cc": ["cc@example.com"], "bcc": ["audit@example.com"],
             "subject": f"Quote 7 (api_key={SECRET})", "text": BODY_TEXT,
             "html": f"<p>{BODY_TEXT}</p>", "headers": {"X-Campaign": HEADER_VALUE},
             "attachments": [{"filename": "quote-7.pdf", "content_type": "application/pdf",
                              "content": base64.b64encode(b"%PDF" * 300).decode()}]}
    assert await _send(console, "POST", "/v1/email", _headers(lease, "mail-1"),
                       json=email) == 200
    row = await _row(console, "mail-1")
    status, html, _ = await console.page("/console/effect?client=agents&key=mail-1")
    assert status == 200
    request = html[html.index('id="request"'):html.index('id="attempts"')]
    for shown in ("agent@example.com", "lead@example.com, boss@example.com",
                  "cc@example.com", "audit@example.com", "Quote 7 (api_key=***)",
                  "X-Campaign", "quote-7.pdf (application/pdf, 1,200 bytes)",
                  f"{len(BODY_TEXT):,} bytes",
                  fingerprint.message_id("agents", "mail-1").strip("<>")):
        assert shown in request, shown
    for where in (html, row):
        for hidden in (SECRET, BODY_TEXT, HEADER_VALUE, "JVBERiVQREYl"):
            assert hidden not in where, hidden


async def test_an_http_calls_page_shows_method_path_and_header_names(console: Console,
                                                                     ) -> None:
    """Method, path with its query (a secret in it blanked, whatever its
    encoding), the forwarded header names, the body's size and type; not
    the body, not a header's value."""
    await console.login()
    lease = await LeaseClient(pool=console.pool).claim("run:sent-http", ttl=60, owner="w")
    assert lease is not None
    body = json.dumps({"note": BODY_TEXT}).encode()
    path = f"/v1/http/crm/contacts/7/notes?source=agent&api_key={SECRET}&api%5Fkey=zz9secret"
    assert await _send(console, "POST", path,
                       {**_headers(lease, "http-1"), "X-Trace": HEADER_VALUE,
                        "Content-Type": "application/json"}, data=body) == 200
    row = await _row(console, "http-1")
    status, html, _ = await console.page("/console/effect?client=agents&key=http-1")
    assert status == 200
    request = html[html.index('id="request"'):html.index('id="attempts"')]
    for shown in ("POST contacts/7/notes?source=agent&amp;api_key=***&amp;",
                  "X-Trace", "Content-Type", f"{len(body):,} bytes", "application/json"):
        assert shown in request, shown
    for where in (html, row):
        for hidden in (SECRET, "zz9secret", BODY_TEXT, HEADER_VALUE, API_KEY):
            assert hidden not in where, hidden
    # the API and the CLI read the same summary
    async with console.http.get(console.url + "/v1/effects/http-1",
                                headers={"Authorization": f"Bearer {API_KEY}"}) as r:
        shown_by_api = await r.json()
    assert shown_by_api["request_summary"]["method"] == "POST"
    names = set(shown_by_api["request_summary"]["headers"])
    assert {"X-Trace", "Content-Type"} <= names and "Authorization" not in names


async def test_the_summary_is_the_first_admissions_and_a_batch_keeps_each(
        pool: asyncpg.Pool) -> None:
    """The admission stores the summary only when it inserts the effect: a
    later attempt of the key (a resend inside the provider's window) keeps the
    first one's. The batch statement stores each entry's own."""
    await pool.execute("""
        INSERT INTO fencegate_leases (resource, owner, fence, claimed_at, expires_at)
        VALUES ('run:s', 'w', 1, clock_timestamp(), clock_timestamp() + interval '1 hour')""")
    admit = ("SELECT verdict FROM fencegate_admit_effect('agents', 'k', '\\x00'::bytea, "
             "'run:s', 1, 'crm', $1, 0.01, 600, 5, $2::jsonb)")
    assert await pool.fetchval(admit, 1, '{"first": true}') == "admitted"
    await pool.execute("UPDATE fencegate_effects SET deadline = deadline - interval '1 hour'")
    assert await pool.fetchval(admit, 2, '{"second": true}') == "admitted"  # sent again
    assert await pool.fetchval("SELECT attempts FROM fencegate_effects") == 2
    assert json.loads(await pool.fetchval(
        "SELECT request_summary FROM fencegate_effects")) == {"first": True}
    rows = await pool.fetch(
        "SELECT ord, verdict FROM fencegate_admit_effects("
        "ARRAY['agents', 'agents'], ARRAY['b2', 'b1'], ARRAY['\\x01', '\\x02']::bytea[], "
        "ARRAY['run:s', 'run:s'], ARRAY[1, 1]::bigint[], ARRAY['crm', 'crm'], "
        "ARRAY[3, 4]::bigint[], ARRAY[60, 60]::float8[], ARRAY[0, 0]::float8[], 5, "
        "ARRAY['{\"n\": 2}', '{\"n\": 1}']::jsonb[])")
    assert sorted((r["ord"], r["verdict"]) for r in rows) == [(1, "admitted"), (2, "admitted")]
    kept = {r["idempotency_key"]: json.loads(r["request_summary"]) for r in await pool.fetch(
        "SELECT idempotency_key, request_summary FROM fencegate_effects "
        "WHERE idempotency_key IN ('b1', 'b2')")}
    assert kept == {"b1": {"n": 1}, "b2": {"n": 2}}
    # and through the ledger: admissions of one turn go as one batch statement
    ledger = Ledger(Database(pool=pool, timeout=10.0))
    keys = [f"l{i}" for i in range(3)]
    admissions = await asyncio.gather(*(ledger.admit(
        "agents", k, k.encode(), "run:s", 1, "crm", new_attempt(), 60.0, 0.0,
        request_summary=json.dumps({"key": k})) for k in keys))
    assert [a.verdict for a in admissions] == ["admitted"] * 3
    kept = {r["idempotency_key"]: json.loads(r["request_summary"]) for r in await pool.fetch(
        "SELECT idempotency_key, request_summary FROM fencegate_effects "
        "WHERE idempotency_key = ANY($1)", keys)}
    assert kept == {k: {"key": k} for k in keys}
    await ledger.drain()
