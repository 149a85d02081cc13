"""The chaos run's providers, in a process of their own: an SMTP sink (plain
SMTP: dedupes nothing) and an HTTP sink that honours Idempotency-Key like a
payment API, for a window. Every delivery is recorded. A seeded fraction of
requests act late (the side effect lands up to 0.8 s after the request
arrived, still within the gateway's timeout: what the drain barrier must wait
out), a smaller fraction answer only after the gateway's timeout (outcome
unknown), some act and then drop the connection without a word, some answer
in pieces. Bodies carry their sha256, so a cut one is seen.

    python -m tests.chaos.sinks SMTP_PORT HTTP_PORT HISTORY_DIR SEED SLOW_FRACTION [WINDOW]

``POST /__chaos/slow-smtp?seconds=S&delay=D`` makes every message wait D
seconds before its answer for the next S seconds: with the gateway's small
SMTP pool, what saturates it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sys
import time
from pathlib import Path

from aiohttp import web
from aiosmtpd.smtp import SMTP, Envelope, Session

from tests.chaos.history import Recorder

SLOW_SECONDS = 3.0
LATE_FRACTION = 0.2
LATE_SECONDS = (0.2, 0.8)
#: acts on the request, then drops the connection without answering
DROP_FRACTION = 0.01
#: answers in pieces
PIECES_FRACTION = 0.1
#: the provider's answer, padded so pieces are real
ANSWER = json.dumps({"ok": True, "pad": "y" * 3000}).encode()
BODY_HASH_HEADER = "X-Body-Sha256"


class Sinks:
    def __init__(self, recorder: Recorder, seed: int, slow_fraction: float,
                 window: float) -> None:
        self.rec = recorder
        self.rng = random.Random(seed)
        self.slow = slow_fraction
        self.window = window
        self.seen_keys: dict[str, float] = {}  # key -> when first acted on
        self.smtp_slow_until = 0.0
        self.smtp_slow_delay = 0.0

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
                        accepted=True, whole=True)
        if time.monotonic() < self.smtp_slow_until:
            await asyncio.sleep(self.smtp_slow_delay)  # accepted, the answer waits
        if self.rng.random() < self.slow:
            await asyncio.sleep(SLOW_SECONDS)  # accepted, but the answer comes too late
        return "250 accepted"

    def _accept(self, key: str) -> bool:
        """Whether a request with this key acts: a key seen inside the window
        is deduped; one seen longer ago acts again (a provider's window)."""
        now = time.time()
        first = self.seen_keys.get(key)
        if first is not None and now - first <= self.window:
            return False
        self.seen_keys[key] = now
        return True

    async def http(self, request: web.Request) -> web.StreamResponse:
        if request.path == "/__chaos/slow-smtp":
            self.smtp_slow_delay = float(request.query["delay"])
            self.smtp_slow_until = time.monotonic() + float(request.query["seconds"])
            return web.Response(text="ok")
        body = await request.read()
        key = request.headers.get("Idempotency-Key", "")
        whole = hashlib.sha256(body).hexdigest() == request.headers.get(BODY_HASH_HEADER)
        await self.act_late()
        accepted = self._accept(key)
        self.rec.record("delivery", kind="http", key=key, method=request.method,
                        resource=request.headers.get("Fence-Resource"),
                        fence=int(request.headers.get("Fence-Token", "0")), accepted=accepted,
                        whole=whole)
        if self.rng.random() < DROP_FRACTION:
            assert request.transport is not None
            request.transport.abort()  # it acted; the answer never comes
            raise web.HTTPInternalServerError
        if self.rng.random() < self.slow:
            await asyncio.sleep(SLOW_SECONDS)
        if self.rng.random() < PIECES_FRACTION:
            resp = web.StreamResponse(headers={"Content-Type": "application/json"})
            await resp.prepare(request)
            for i in range(0, len(ANSWER), 256):
                await resp.write(ANSWER[i:i + 256])
                await asyncio.sleep(0.001)
            await resp.write_eof()
            return resp
        return web.Response(body=ANSWER, content_type="application/json")


async def main(smtp_port: int, http_port: int, history: Path, seed: int, slow: float,
               window: float) -> None:
    sinks = Sinks(Recorder(history, "sinks"), seed, slow, window)
    loop = asyncio.get_running_loop()
    await loop.create_server(lambda: SMTP(sinks, hostname="chaos", loop=loop), "127.0.0.1",
                             smtp_port)
    app = web.Application(client_max_size=1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", sinks.http)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", http_port).start()
    await asyncio.Event().wait()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), int(sys.argv[4]),
                     float(sys.argv[5]), float(sys.argv[6]) if len(sys.argv) > 6 else 3600.0))
