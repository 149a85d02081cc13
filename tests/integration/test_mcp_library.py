"""The run's tools as a plain Python library (``gateway.mcp.RunTools`` and
the generic adapter of ``gateway.mcp.adapter``) against a real gateway
(issue 27): a framework's tool built from a ``FunctionTool`` sends once; a
run whose lease another worker took while this process did not notice is
refused by the gateway (``stale_fence``), and is lost for every later call;
a released run sends nothing."""

from __future__ import annotations

import asyncio
import json

from langchain_core.tools import StructuredTool

from gateway.mcp import RunTools
from gateway.mcp.adapter import function_tools
from leases import LeaseClient
from tests.integration.conftest import API_KEY, Gw
from tests.support.waiting import until

EMAIL = {"from": "agent@example.com", "to": ["lead@example.com"], "subject": "Hi",
         "text": "Hello!"}


async def test_function_tools_carry_the_schemas_and_send_once(gw: Gw) -> None:
    async with RunTools(gw.url, API_KEY) as run:
        tools = {t.name: t for t in function_tools(run)}
        assert list(tools) == ["claim_run", "send_email", "http_request", "release_run",
                               "run_status"]
        assert tools["send_email"].openai()["function"]["parameters"]["required"] == \
            ["to", "subject"]
        assert tools["run_status"].read_only and tools["send_email"].destructive

        text = await tools["send_email"].call(json.dumps(EMAIL))
        assert text.startswith("no_run") and "claim_run" in text
        claimed = await tools["claim_run"].run('{"resource": "lead:7"}')
        assert not claimed.is_error and claimed.data["held"], claimed.text

        # a LangChain tool (what a LangGraph ToolNode runs), from the adapter alone
        send = tools["send_email"]
        lc = StructuredTool.from_function(coroutine=send.call, name=send.name,
                                          description=send.description,
                                          args_schema=send.parameters)
        first = json.loads(await lc.ainvoke(EMAIL))
        again = json.loads(await lc.ainvoke(EMAIL))
        assert first["status"] == "sent" and again["replayed"]
        assert again["message_id"] == first["message_id"]
        assert len(gw.smtp.deliveries) == 1

        bad = await tools["send_email"].run("{not json")
        assert bad.is_error and bad.text.startswith("bad_request")
        bad = await tools["http_request"].run(provider="hook", method="BREW", path="x")
        assert bad.is_error and "'method'" in bad.text


async def test_a_run_taken_over_unnoticed_is_refused_by_the_gateway(gw: Gw, dsn: str) -> None:
    """The lease ends in the database while this process still trusts it
    (its local deadline not reached): the gateway refuses the next email by
    fence, the run is lost from then on, and nothing was sent."""
    async with RunTools(gw.url, API_KEY) as run:
        claimed = await run.call("claim_run", {"resource": "run:unnoticed"})
        assert not claimed.is_error, claimed.text
        await gw.pool.execute("UPDATE fencegate_leases SET expires_at = clock_timestamp() "
                              "WHERE resource = 'run:unnoticed'")
        async with LeaseClient(dsn, owner="other") as other:
            taken = await other.claim("run:unnoticed", ttl=60)
            assert taken is not None and taken.fence > claimed.data["fence"]
            refused = await run.call("send_email", EMAIL)
            assert refused.is_error and refused.text.startswith("stale_fence"), refused.text
            assert "Stop" in refused.text
            later = await run.call("http_request", {"provider": "hook", "method": "POST",
                                                    "path": "x"})
            assert later.is_error and later.text.startswith("stale_fence")
            status = await run.call("run_status", {})
            assert status.data["held"] is False and status.data["reason"] == "stale_fence"
            again = await run.call("claim_run", {"resource": "run:unnoticed"})
            assert again.is_error and again.text.startswith("lease_held")  # the other's
    assert gw.smtp.deliveries == [] and gw.hook.deliveries == []


async def test_a_released_run_sends_nothing_and_may_be_claimed_again(gw: Gw) -> None:
    async with RunTools(gw.url, API_KEY) as run:
        first = await run.call("claim_run", {"resource": "run:rel"})
        assert not first.is_error
        done = await run.call("release_run", {})
        assert done.data["released"] is True
        refused = await run.call("send_email", EMAIL)
        assert refused.is_error and refused.text.startswith("run_released")
        assert (await gw.leases.show("run:rel")) is not None
        again = await run.call("claim_run", {"resource": "run:rel"})
        assert not again.is_error and again.data["fence"] > first.data["fence"]
        other = await run.call("claim_run", {"resource": "run:other"})
        assert other.is_error and other.text.startswith("run_held")
    assert gw.smtp.deliveries == []


async def test_the_run_is_kept_renewed_over_the_lease_api(gw: Gw) -> None:
    async with RunTools(gw.url, API_KEY) as run:
        claimed = await run.call("claim_run", {"resource": "run:kept", "ttl_seconds": 3})
        assert not claimed.is_error, claimed.text
        seen = {claimed.data["expires_at"]}

        async def renewed_twice() -> bool:
            status = (await run.call("run_status", {})).data
            assert status["held"], status
            seen.add(status["expires_at"])
            return len(seen) > 2
        await until(renewed_twice, "two renewals of a 3 s lease")
        sent = await run.call("send_email", EMAIL)
        assert not sent.is_error and sent.data["fence"] == claimed.data["fence"], sent.text
    assert len(gw.smtp.deliveries) == 1
    assert (await gw.leases.show("run:kept")).live is False  # released on close


async def test_overlapping_claims_leave_one_run(gw: Gw) -> None:
    """A framework that runs tool calls in parallel: two claims of two runs
    at once end with one run held and the other never claimed."""
    async with RunTools(gw.url, API_KEY) as run:
        answers = await asyncio.gather(
            run.call("claim_run", {"resource": "run:one"}),
            run.call("claim_run", {"resource": "run:two"}))
        assert sorted(a.is_error for a in answers) == [False, True]
        [won] = [a for a in answers if not a.is_error]
        [lost] = [a for a in answers if a.is_error]
        assert lost.text.startswith("run_held")
        other = "run:two" if won.data["resource"] == "run:one" else "run:one"
        assert await gw.leases.show(other) is None
