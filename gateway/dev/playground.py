"""The console's playground, in ``fencegate dev`` only: the job platform's
scenario (gateway/dev/charges.py) driven from buttons, the jobs moving
through their states live on ``/console/dev/playground``.

Buttons: enqueue a charge, duplicate it (the same dedupe key: nothing
added, charged once), a flaky job (retries on its own), a poison job (to
the dead letters), and "fix and replay" (the dead letters back to the
queue, the poison job's bug fixed). Each is a console action: operators
only, CSRF token and origin checked, logged with the operator's name. The
worker runs in the dev process, on a queue of its own per start.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import time
from collections.abc import AsyncIterator
from typing import Any

from aiohttp import web

from gateway import console
from gateway.console import session
from gateway.dev.charges import Charges, charges_received, describe, new_queue_name, running
from gateway.dev.sinks import WebhookSink
from leases import search

log = logging.getLogger("fencegate.console")

PATH = "/console/dev/playground"
#: the timeline keeps this many events, newest first
EVENTS = 40
ACTIONS = ("charge", "duplicate", "flaky", "poison", "replay")
NOTICES = {
    "charge": "A charge was enqueued: watch it run, then duplicate it.",
    "duplicated": "The same charge again, with the same dedupe key: nothing was added, "
                  "the charge is made once.",
    "no_charge": "Enqueue a charge first: there is nothing to duplicate.",
    "flaky": "A flaky job was enqueued: it fails twice, then succeeds on its own.",
    "poison": "A poison job was enqueued: it fails every attempt and goes to the dead "
              "letters.",
    "replayed": "The bug is fixed: the dead letters are back in the queue.",
    "nothing_dead": "No dead job to replay (yet: a poison job takes a second to die).",
    "refused": "That action was refused (an expired page?): reload and try again.",
}


class Playground:
    """The scenario's queue and worker, started on the first button press."""

    def __init__(self, dsn: str, api_key: str, sink: WebhookSink) -> None:
        self.dsn, self.api_key, self.sink = dsn, api_key, sink
        #: the gateway's own address, once it listens (dev_stack sets it)
        self.url: str | None = None
        self.queue_name = new_queue_name().replace("demo-", "playground-", 1)
        self.events: collections.deque[tuple[float, str, str]] = collections.deque(
            maxlen=EVENTS)
        self.last_order: int | None = None
        self._started = time.monotonic()
        self._charges: Charges | None = None
        self._stack = contextlib.AsyncExitStack()

    def say(self, who: str, what: str) -> None:
        self.events.appendleft((time.monotonic() - self._started, who, what))

    async def charges(self) -> Charges:
        if self._charges is None:
            if self.url is None:
                raise web.HTTPServiceUnavailable(text="the gateway is still starting")
            self._charges = await self._stack.enter_async_context(running(
                self.dsn, self.url, self.api_key, self.queue_name, self.say))
        return self._charges

    async def act(self, action: str) -> str:
        """Do what the button ``action`` says; the notice to show."""
        charges = await self.charges()
        if action == "charge":
            done = await charges.charge()
            self.last_order = charges.last_order
            self.say("you", f"enqueue a charge for order {self.last_order}: job {done.id}")
            return "charge"
        if action == "duplicate":
            if self.last_order is None:
                return "no_charge"
            again = await charges.duplicate(self.last_order)
            self.say("you", f"duplicate the charge for order {self.last_order}: "
                     + ("deduplicated, still job " if again.deduplicated else "job ")
                     + str(again.id))
            return "duplicated"
        if action == "flaky":
            self.say("you", f"enqueue a flaky job: job {await charges.flaky()}")
            return "flaky"
        if action == "poison":
            self.say("you", f"enqueue a poison job: job {await charges.poison()}")
            return "poison"
        charges.fix()
        replayed = await charges.replay()
        self.say("you", f"fix the bug, replay the dead letters: {replayed} job(s) back")
        return "replayed" if replayed else "nothing_dead"

    async def close(self) -> None:
        await self._stack.aclose()


PLAYGROUND = web.AppKey("playground", Playground)


async def page(request: web.Request) -> web.StreamResponse:
    sess, operator = console._operator(request)
    playground = request.app[PLAYGROUND]
    gw = console._gw(request)
    found = await search.find_jobs(gw.leases, search.JobFilter(queue=playground.queue_name),
                                   limit=50)
    jobs = [{**j, "what": describe(j["payload"])} for j in found.jobs]
    context: dict[str, Any] = {
        "screen": "playground", "title": "Playground", "titles": console.TITLES,
        "operator": operator.name, "csrf": sess.csrf(request.app[session.SECRET_KEY]),
        "notice": NOTICES.get(request.query.get("notice", "")),
        "part": bool(request.query.get("part")), "error": None,
        "queue": playground.queue_name, "jobs": jobs, "events": list(playground.events),
        "charged": charges_received(playground.sink), "last_order": playground.last_order,
    }
    return console._render("playground.html", request, context)


async def act(request: web.Request) -> web.StreamResponse:
    action = request.match_info["action"]
    checked = await console._action(request)
    if checked is None or action not in ACTIONS:
        raise web.HTTPSeeOther(f"{PATH}?notice=refused")
    operator, _ = checked
    notice = await request.app[PLAYGROUND].act(action)
    log.info("operator %s pressed %s in the playground: %s", operator.name, action, notice,
             extra={"operator": operator.name, "action": f"playground_{action}",
                    "result": notice})
    raise web.HTTPSeeOther(f"{PATH}?notice={notice}")


def enable(app: web.Application, dsn: str, api_key: str, sink: WebhookSink) -> Playground:
    """Add the playground to a dev gateway's app (before it starts); set
    ``.url`` once it listens."""
    playground = Playground(dsn, api_key, sink)
    app[PLAYGROUND] = playground
    app.router.add_get(PATH, page, allow_head=False)
    app.router.add_post(PATH + "/{action}", act)

    async def lifetime(app: web.Application) -> AsyncIterator[None]:
        yield
        await playground.close()

    app.cleanup_ctx.append(lifetime)
    return playground
