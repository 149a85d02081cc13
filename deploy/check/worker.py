"""A worker process as a deployment runs one: a ``leases.Worker`` on a queue,
sending each job's email through the gateway, with ``/metrics`` on a port.

    FENCEGATE_DATABASE_URL=... FENCEGATE_API_KEY=... \\
        python deploy/check/worker.py --gateway http://127.0.0.1:8080 --metrics-port 9464

A job's payload is ``{"to": ADDRESS}``, optionally with ``"fail": true`` (the
handler raises: the job is retried, then dead) or ``"seconds": N`` (it works
that long first, so its lease is renewed). ``make deploy-check`` runs this
against ``fencegate serve`` and a real Prometheus (deploy/check/scrape.py).
"""

from __future__ import annotations

import argparse
import asyncio
import os

import uvloop

from gateway.client import GatewayClient
from leases import Job, LeaseClient, Queue, Worker


async def main(args: argparse.Namespace) -> None:
    api_key = os.environ["FENCEGATE_API_KEY"]
    async with LeaseClient(os.environ["FENCEGATE_DATABASE_URL"]) as client, \
            GatewayClient(args.gateway, api_key) as gateway:

        async def handle(job: Job) -> str:
            if job.payload.get("fail"):
                raise RuntimeError("the lead's address was refused upstream")
            await asyncio.sleep(float(job.payload.get("seconds", 0)))
            sent = await gateway.send_email(
                job.lease, f"{job.queue}-{job.id}", sender="agent@example.com",
                to=[job.payload["to"]], subject="Your quote", text="Here is your quote.")
            return str(sent.json()["message_id"])

        worker = Worker(Queue(client, args.queue), handle, concurrency=4, ttl=args.ttl,
                        metrics_port=args.metrics_port, metrics_host=args.metrics_host)
        await worker.run(handle_signals=True)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--gateway", required=True, help="the gateway's base URL")
    parser.add_argument("--queue", default="outreach")
    parser.add_argument("--ttl", type=float, default=30.0, help="each job's lease, seconds")
    parser.add_argument("--metrics-port", type=int, default=9464)
    parser.add_argument("--metrics-host", default="0.0.0.0")
    uvloop.run(main(parser.parse_args()))
