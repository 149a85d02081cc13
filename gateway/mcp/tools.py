"""``RunTools``: the five tools of one agent run as a plain Python object, the
one the MCP server serves and ``gateway.mcp.adapter`` hands to frameworks.

``await tools.call(name, arguments)`` never raises for what a model can cause:
it answers a ``ToolAnswer`` whose ``text`` starts with a code when
``is_error`` is true:

- ``no_run``: no run claimed yet (call ``claim_run``);
- ``stale_fence``, ``lease_expired``, ``no_lease``, ``invalid_fence``,
  ``run_released``: the run is not this session's any more; stop, nothing
  was sent;
- ``bad_request``: the arguments (or the gateway) refused the call; fix it;
- any other gateway problem code (``effect_in_progress``,
  ``effect_outcome_unknown``, ``rate_limited``, ...), ``gateway_unreachable``
  and ``provider_status``, each saying whether repeating the call is safe.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any

import aiohttp

from gateway import client as gwc
from gateway.mcp import arguments, specs
from gateway.mcp.run import LeaseApi, LeaseApiProblem, Run, RunLost

_STOP = "Stop working on this run: do not retry, do not call the other effect tools."
#: provider bodies longer than this are cut in a tool's answer
MAX_BODY_CHARS = 4000


@dataclass(frozen=True)
class ToolAnswer:
    """What a tool call answers: ``text`` for the model, ``data`` (a JSON
    object) for programs, and whether it is an error."""

    text: str
    is_error: bool = False
    data: dict[str, Any] = field(default_factory=dict)


def _error(code: str, text: str, **data: Any) -> ToolAnswer:
    return ToolAnswer(f"{code}: {text}", True, {"error": code, **data})


def _ok(data: dict[str, Any]) -> ToolAnswer:
    return ToolAnswer(json.dumps(data, ensure_ascii=False), False, data)


def derived_key(tool: str, resource: str, args: dict[str, Any]) -> str:
    """The idempotency key of a call given none: the tool, the run's resource
    and the canonical JSON of the arguments (key order and spacing do not
    count), so an identical repeated call is the same effect."""
    canonical = json.dumps(args, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    digest = hashlib.sha256(f"{tool}\0{resource}\0{canonical}".encode()).hexdigest()
    return f"mcp-{tool}-{digest[:40]}"


class RunTools:
    """One run's tools against the gateway at ``gateway_url``, as the client
    of ``api_key``. ``default_sender``: the ``from`` of an email that names
    none. Make it inside a coroutine (it opens an HTTP session on the running
    loop) and close it (or use ``async with``): the run is released.

    Calls may overlap; claiming and releasing are serialised, so one
    ``RunTools`` never holds two runs."""

    specs = specs.TOOLS

    def __init__(self, gateway_url: str, api_key: str, *, default_sender: str | None = None,
                 timeout_seconds: float = 60.0) -> None:
        self._http = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=timeout_seconds))
        self._api = LeaseApi(self._http, gateway_url, api_key)
        self._gw = gwc.GatewayClient(gateway_url, api_key, session=self._http)
        self._sender = default_sender
        self.run: Run | None = None
        self._claiming = asyncio.Lock()

    async def __aenter__(self) -> RunTools:
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None,
                        exc: BaseException | None, tb: TracebackType | None) -> None:
        await self.close()

    async def close(self) -> None:
        """Release the run (if held) and close the HTTP session."""
        async with self._claiming:
            if self.run is not None:
                await self.run.release()
        await self._http.close()

    async def call(self, name: str, args: Any) -> ToolAnswer:
        """Run tool ``name`` with ``args`` (a JSON object)."""
        spec = specs.BY_NAME.get(name)
        if spec is None:
            return _error("bad_request", f"no tool {name!r} (tools: "
                          f"{', '.join(specs.BY_NAME)})")
        try:
            checked = arguments.check(spec.input_schema, args)
        except arguments.BadArguments as exc:
            return _error("bad_request", f"{exc}. Fix the arguments and call {name} again.")
        handler = getattr(self, f"_{name}")
        answer: ToolAnswer = await handler(checked)
        return answer

    # ---- the run ---------------------------------------------------------------

    def _status(self, run: Run) -> dict[str, Any]:
        lost = run.lost
        return {"resource": run.resource, "held": lost is None, "fence": run.fence,
                "owner": run.owner, "expires_at": run.expires_at,
                "seconds_left": round(run.seconds_left(), 3),
                **({"reason": lost.reason} if lost is not None else {})}

    async def _claim_run(self, args: dict[str, Any]) -> ToolAnswer:
        async with self._claiming:
            return await self._claim(args)

    async def _claim(self, args: dict[str, Any]) -> ToolAnswer:
        resource, ttl = args["resource"], float(args.get("ttl_seconds",
                                                         specs.DEFAULT_TTL_SECONDS))
        run = self.run
        if run is not None and run.lost is None:
            if run.resource == resource:
                return _ok(self._status(run))
            return _error("run_held", f"this session already works on {run.resource}; "
                          "call release_run before claiming another run")
        if run is not None:  # lost here, perhaps still live there within the margin
            await run.release()
        try:
            claimed = await Run.claim(self._api, resource, ttl)
        except LeaseApiProblem as exc:
            return _error(exc.code, exc.detail or "the gateway refused the claim")
        except gwc.GatewayUnreachable as exc:
            return _error("gateway_unreachable", f"{exc}; call claim_run again")
        if claimed is None:
            return _error("lease_held", f"another agent is working on {resource}: do not "
                          "act on it")
        self.run = claimed
        return _ok(self._status(claimed))

    async def _release_run(self, args: dict[str, Any]) -> ToolAnswer:
        if self.run is None:
            return _error("no_run", "no run was claimed in this session")
        async with self._claiming:
            run, held = self.run, self.run.lost is None
            released = await run.release()
        return _ok({"resource": run.resource, "fence": run.fence,
                    "released": released and held})

    async def _run_status(self, args: dict[str, Any]) -> ToolAnswer:
        if self.run is None:
            return _ok({"held": False, "resource": None,
                        "note": "no run claimed yet: call claim_run"})
        return _ok(self._status(self.run))

    # ---- effects ---------------------------------------------------------------

    def _held_run(self) -> Run | ToolAnswer:
        run = self.run
        if run is None:
            return _error("no_run", "no run is claimed in this session: call claim_run "
                          "with the run's resource first")
        lost = run.lost
        if lost is not None:
            return self._lost(run, lost)
        return run

    def _lost(self, run: Run, lost: RunLost) -> ToolAnswer:
        return _error(lost.reason, f"run {run.resource} (fence {run.fence}) is no longer "
                      f"yours ({lost.detail}); nothing was sent. {_STOP}",
                      resource=run.resource, fence=run.fence)

    async def _send_email(self, args: dict[str, Any]) -> ToolAnswer:
        run = self._held_run()
        if isinstance(run, ToolAnswer):
            return run
        sender = args.get("from", self._sender)
        if sender is None:
            return _error("bad_request", "'from' is required (this server has no default "
                          "sender). Fix the arguments and call send_email again.")
        key = args.pop("idempotency_key", None) or derived_key("send_email", run.resource, args)
        effect = self._gw.send_email(
            run, key, sender=sender, to=args["to"], subject=args["subject"],
            text=args.get("text"), html=args.get("html"), cc=args.get("cc"),
            bcc=args.get("bcc"), reply_to=args.get("reply_to"), provider=args.get("provider"))
        return await self._effect(run, key, effect, email=True)

    async def _http_request(self, args: dict[str, Any]) -> ToolAnswer:
        run = self._held_run()
        if isinstance(run, ToolAnswer):
            return run
        key = args.pop("idempotency_key", None) or derived_key("http_request", run.resource,
                                                               args)
        effect = self._gw.request(run, key, args["provider"], args["method"], args["path"],
                                  json=args.get("json"))
        return await self._effect(run, key, effect, email=False)

    async def _effect(self, run: Run, key: str, effect: Any, *, email: bool) -> ToolAnswer:
        try:
            result: gwc.Result = await effect
        except RunLost as lost:
            return self._lost(run, lost)
        except gwc.FenceRejected as exc:
            run.lose(exc.code, exc.detail)
            return self._lost(run, RunLost(exc.code, exc.detail))
        except gwc.GatewayProblem as exc:
            return _problem(exc, key)
        except gwc.GatewayUnreachable:
            return _error("gateway_unreachable", "no answer from the gateway: the effect may "
                          "or may not have been sent. Repeat the identical call to learn "
                          "(it is replayed, never sent twice).", idempotency_key=key)
        data: dict[str, Any] = {"idempotency_key": key, "replayed": result.replayed,
                                "fence": run.fence}
        if email:
            return _ok({**result.json(), **data})
        body = result.body.decode(errors="replace")
        data.update(status=result.status, body=body[:MAX_BODY_CHARS],
                    truncated=len(body) > MAX_BODY_CHARS)
        if result.status >= 400:
            return ToolAnswer(f"provider_status: the provider answered {result.status}: "
                              f"{body[:MAX_BODY_CHARS]}", True, {"error": "provider_status",
                                                                  **data})
        return _ok(data)


#: what the model should do after each gateway problem
_ADVICE = {
    "effect_in_progress": "the same effect is in flight now: repeat the identical call in "
                          "a few seconds to get its answer",
    "effect_outcome_unknown": "an earlier attempt may have reached the provider; it will not "
                              "be sent again until an operator resolves it: do not retry",
    "idempotency_key_reused": "this key was used for a different request: use a new "
                              "idempotency_key for a new effect",
    "rate_limited": "nothing was sent: repeat the identical call later",
    "provider_error": "the provider failed, nothing was kept: repeating the call is safe",
    "unavailable": "the gateway failed closed, nothing was sent: repeat the call later",
    "overloaded": "nothing was sent: repeat the call later",
    "provider_timeout": "the outcome is unknown: do not retry",
    "provider_rejected": "the provider refused the email for good",
}


def _problem(exc: gwc.GatewayProblem, key: str) -> ToolAnswer:
    advice = _ADVICE.get(exc.code, "")
    detail = exc.detail or str(exc)
    text = f"{detail}. {advice}" if advice else detail
    extra: dict[str, Any] = {"idempotency_key": key, "status": exc.status}
    if exc.retry_after is not None:
        extra["retry_after"] = exc.retry_after
    return _error(exc.code, text, **extra)
