"""The chaos run's providers, in a process of their own: an SMTP sink (plain
SMTP: dedupes nothing) and an HTTP sink that honours Idempotency-Key like a
payment API. Every delivery is recorded. A seeded fraction of requests act
late (the side effect lands up to 0.8 s after the request arrived, still within
the gateway's timeout: what the drain barrier must wait out), and a smaller
fraction answer only after the gateway's timeout (outcome unknown).

    python -m tests.chaos.sinks SMTP_PORT HTTP_PORT HISTORY_DIR SEED SLOW_FRACTION
"""

from __future__ import annotations

import asyncio
import random
import sys
from pathlib import Path

from aiohttp import web
from aiosmtpd.smtp import SMTP, Envelope, Session

from tests.chaos.history import Recorder

SLOW_SECONDS = 3.0
LATE_FRACTION = 0.2
LATE_SECONDS = (0.2, 0.8)


class Sinks:
    def __init__(self, recorder: Recorder, seed: int, slow_fraction: float) -> None:
        self.rec = recorder
        self.rng = random.Random(seed)
        self.slow = slow_fraction
        self.seen_keys: dict[str, bytes] = {}

    async def act_late(self) -> None:
        if self.rng.random() < LATE_FRACTION:
            await asyncio.sleep(self.rng.uniform(*LATE_SECONDS))

    async def handle_DATA(self, server: SMTP, session: Session, envelope: Envelope) -> str:
        import email
        import email.policy

        msg = email.message_from_bytes(envelope.original_content or b"",
                                       policy=email.policy.default)
        await self.act_late()
        self.rec.record("delivery", kind="smtp", key=str(msg["Message-ID"]),
                        resource=str(msg["Fence-Resource"]), fence=int(msg["Fence-Token"]),
                        accepted=True)
        if self.rng.random() < self.slow:
            await asyncio.sleep(SLOW_SECONDS)  # accepted, but the answer comes too late
        return "250 accepted"

    async def http(self, request: web.Request) -> web.Response:
        await request.read()
        key = request.headers.get("Idempotency-Key", "")
        await self.act_late()
        accepted = key not in self.seen_keys
        self.rec.record("delivery", kind="http", key=key,
                        resource=request.headers.get("Fence-Resource"),
                        fence=int(request.headers.get("Fence-Token", "0")), accepted=accepted)
        if accepted:
            self.seen_keys[key] = b'{"ok": true}'
        if self.rng.random() < self.slow:
            await asyncio.sleep(SLOW_SECONDS)
        return web.Response(body=self.seen_keys[key], content_type="application/json")


async def main(smtp_port: int, http_port: int, history: Path, seed: int, slow: float) -> None:
    sinks = Sinks(Recorder(history, "sinks"), seed, slow)
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: SMTP(sinks, hostname="chaos", loop=loop), "127.0.0.1",
                             smtp_port)
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", sinks.http)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", http_port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]),
                     float(sys.argv[5])))
