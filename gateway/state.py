"""What the running gateway holds, shared through ``web.AppKey``s."""

from __future__ import annotations

import random
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field

import asyncpg
from aiohttp import web

from gateway.api.auth import Authenticator
from gateway.config import Config
from gateway.effects.pace import Pauses
from gateway.effects.ratelimit import TokenBucket
from gateway.effects.rejections import RejectionLog
from gateway.ledger import Ledger
from gateway.providers import Provider, ProviderCall
from leases import LeaseClient
from leases.observe import QueueCollector


@dataclass
class Gateway:
    config: Config
    pool: asyncpg.Pool
    ledger: Ledger
    leases: LeaseClient
    auth: Authenticator
    providers: dict[str, Provider]
    buckets: dict[str, TokenBucket] = field(default_factory=dict)
    #: this process's share of each provider's rate (1/N with N serving processes)
    rate_share: float = 1.0
    #: API requests being handled now in this process (their bodies arrived)
    in_flight: int = 0
    #: bodies being received now, by client (gateway/effects/slots.py)
    receiving: dict[str, int] = field(default_factory=dict)
    #: queue depths and database reachability for /metrics (leases.observe)
    observer: QueueCollector | None = None
    #: fence rejections recorded for the console (gateway/effects/rejections.py)
    rejections: RejectionLog | None = None
    #: providers that answered 429, paused for every caller (gateway/effects/pace.py)
    pauses: Pauses = field(default_factory=Pauses)
    #: the jitter of resend backoffs (gateway/effects/resend.py)
    rng: random.Random = field(default_factory=random.Random)
    #: test hook: awaited before each resend asks the ledger to extend its
    #: attempt (after the backoff), so a test can act in between without sleeping
    before_resend: Callable[[ProviderCall], Awaitable[None]] | None = None


GATEWAY = web.AppKey("gateway", Gateway)
