"""What a gateway configuration is: the server, its clients and its
providers, as frozen dataclasses, with their defaults. Reading the file into
them is gateway/config/read.py."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal
from urllib.parse import unquote

from gateway.config.fill import AwsCredentials
from gateway.config.presets import (
    DEFAULT_NOT_ACTED_STATUSES,
    DEFAULT_PACE,
    DEFAULT_UNKNOWN_STATUSES,
    Pace,
    Preset,
)
from leases.database import DATABASE_URL_ENV

#: the status a provider that dedupes on our key gives a key still held by an attempt
CONFLICT = 409

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8080
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
DEFAULT_DATABASE_URL_ENV = DATABASE_URL_ENV
DEFAULT_TIMEOUT_SECONDS = 10.0
DEFAULT_RATE_LIMIT_PER_SECOND = 50.0
DEFAULT_HTTP_IDEMPOTENCY_HEADER = "Idempotency-Key"
DEFAULT_RETENTION_SECONDS = 7 * 24 * 3600.0
DEFAULT_DATABASE_TIMEOUT_SECONDS = 5.0
DEFAULT_BODY_TIMEOUT_SECONDS = 30.0
DEFAULT_BARRIER_GRACE_SECONDS = 2.0
DEFAULT_DATABASE_POOL_SIZE = 20
#: the default bound on requests in flight, per database connection: an effect
#: holds a connection only for its two statements, and waits on the provider
#: in between, so several share one
REQUESTS_PER_CONNECTION = 8
DEFAULT_SMTP_POOL_SIZE = 4
#: resends after an unknown outcome, inside the provider's idempotency window
#: (HTTP providers that dedupe on our key; gateway/effects/resend.py)
DEFAULT_RESEND_ATTEMPTS = 2
MAX_RESEND_ATTEMPTS = 10

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class ServerConfig:
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    #: finished effects are kept this long for replay, then purged
    effect_retention_seconds: float = DEFAULT_RETENTION_SECONDS
    #: a database call slower than this fails closed (503)
    database_timeout_seconds: float = DEFAULT_DATABASE_TIMEOUT_SECONDS
    #: a request body that takes longer than this to arrive is refused (408)
    body_timeout_seconds: float = DEFAULT_BODY_TIMEOUT_SECONDS
    #: the database holds an attempt's place in the drain barrier this much
    #: longer than the gateway's own deadline for it: bytes written just before
    #: that deadline must have reached the provider by then
    barrier_grace_seconds: float = DEFAULT_BARRIER_GRACE_SECONDS
    #: requests taken on at once per process (0: the database pool size times
    #: REQUESTS_PER_CONNECTION); past it, 503 overloaded at once
    max_requests_in_flight: int = 0


#: what a client is: a worker (the default) or also an operator
Role = Literal["worker", "operator"]
ROLES: tuple[Role, ...] = ("worker", "operator")


@dataclass(frozen=True)
class ClientConfig:
    name: str
    key_sha256: str
    resources: tuple[str, ...]
    #: more API keys of the same client, accepted alike: a key being rotated in or out
    more_keys_sha256: tuple[str, ...] = ()
    #: "operator": may also log in to the console (gateway/console/)
    role: Role = "worker"
    #: the providers this client may use; None (the key absent): every one
    providers: tuple[str, ...] | None = None
    #: per HTTP provider, the path prefixes (whole segments, no leading "/")
    #: the client may use; a provider not named here: any path
    provider_paths: Mapping[str, tuple[str, ...]] = field(default_factory=dict, hash=False)

    def may_use(self, provider: str) -> bool:
        """Whether this client may send effects through ``provider``."""
        return self.providers is None or provider in self.providers

    def may_use_path(self, provider: str, path: str) -> bool:
        """Whether ``path`` (below the provider's base URL, as sent) is under
        one of the client's prefixes for ``provider``, segment by segment,
        both as sent and decoded: a server may read it either way."""
        prefixes = self.provider_paths.get(provider)
        if prefixes is None:
            return True
        raw = path.split("?", 1)[0].strip("/")
        return any(_under(raw, p) and _under(unquote(raw), p) for p in prefixes)

    @property
    def keys_sha256(self) -> tuple[str, ...]:
        return (self.key_sha256, *self.more_keys_sha256)


def _under(path: str, prefix: str) -> bool:
    return path == prefix or path.startswith(prefix + "/")


@dataclass(frozen=True)
class _ProviderCommon:
    """What every provider has, whatever carries its effects."""

    name: str
    timeout_seconds: float = DEFAULT_TIMEOUT_SECONDS
    rate_limit_per_second: float = DEFAULT_RATE_LIMIT_PER_SECOND
    idempotency_header: str = ""
    idempotency_window_seconds: float = 0.0
    #: the preset the provider was configured from (gateway/config/presets.py), if any
    preset: Preset | None = None

    @property
    def retry_window_seconds(self) -> float:
        """How long a resend of an unanswered effect stays safe (0: never)."""
        return self.idempotency_window_seconds if self.idempotency_header else 0.0

    def retry_window_for(self, method: str, path: str) -> float:
        """``retry_window_seconds`` for one request (``path`` below the base
        URL): 0 where the preset says the provider ignores the key."""
        endpoints = self.preset.idempotency.endpoints if self.preset is not None else ()
        if endpoints and (method.upper(), _endpoint_path(path)) not in endpoints:
            return 0.0
        return self.retry_window_seconds


def _endpoint_path(path: str) -> str:
    """A path as a preset's endpoints name it: without its query and without
    one slash at either end. More slashes stay (``emails//`` is a path of its
    own at the provider, not ``emails``), so such a path matches no endpoint."""
    path = path.split("?", 1)[0]
    path = path[1:] if path.startswith("/") else path
    return path[:-1] if path.endswith("/") else path


@dataclass(frozen=True)
class SmtpProviderConfig(_ProviderCommon):
    kind: Literal["smtp"] = "smtp"
    host: str = ""
    port: int = 25
    tls: Literal["none", "starttls", "tls"] = "none"
    username: str | None = field(default=None, repr=False)
    password: str | None = field(default=None, repr=False)
    pool_size: int = DEFAULT_SMTP_POOL_SIZE
    #: PEM bundle to verify the SMTP server's certificate (default: the system's)
    ca_file: str | None = None

    @property
    def serves_email(self) -> bool:
        return True


@dataclass(frozen=True)
class HttpProviderConfig(_ProviderCommon):
    kind: Literal["http"] = "http"
    base_url: str = ""
    signing_secret: str | None = field(default=None, repr=False)
    #: sent on every request (the caller's Authorization never is):
    #: ``authorization_env``, or a preset's authentication
    auth_headers: Mapping[str, str] = field(default_factory=dict, repr=False)
    #: statuses after which the key is freed: the provider certainly did not act
    not_acted_statuses: frozenset[int] = DEFAULT_NOT_ACTED_STATUSES
    #: statuses after which the outcome is unknown (the provider may have acted)
    unknown_statuses: frozenset[int] = DEFAULT_UNKNOWN_STATUSES
    #: the headers the provider paces its callers with
    pace: Pace = DEFAULT_PACE
    #: an attempt whose outcome is unknown is sent again this many times at
    #: most, while the provider's window covers it (0: never within a request)
    resend_attempts: int = DEFAULT_RESEND_ATTEMPTS
    #: ``POST /v1/email`` may name this provider (a preset with an email API)
    email: bool = False
    #: the ``ses`` preset: the AWS region and the credentials it signs with
    region: str | None = None
    aws: AwsCredentials | None = None
    #: the ``mailgun`` preset: the sending domain
    domain: str | None = None

    @property
    def serves_email(self) -> bool:
        return self.email


#: one provider's settings: a tagged union on ``kind``
ProviderConfig = SmtpProviderConfig | HttpProviderConfig


@dataclass(frozen=True)
class Config:
    server: ServerConfig
    database_url_env: str
    clients: tuple[ClientConfig, ...]
    providers: dict[str, ProviderConfig]
    source: str = "<memory>"
    #: connections to PostgreSQL per gateway process
    database_pool_size: int = DEFAULT_DATABASE_POOL_SIZE

    @property
    def max_requests_in_flight(self) -> int:
        """Requests one process takes on at once; past it, 503 overloaded at once."""
        return self.server.max_requests_in_flight or \
            self.database_pool_size * REQUESTS_PER_CONNECTION

    @property
    def default_email_provider(self) -> str | None:
        """The provider ``POST /v1/email`` uses when the body names none: the
        only one that sends email (SMTP, or an HTTP email preset)."""
        email = [p.name for p in self.providers.values() if p.serves_email]
        return email[0] if len(email) == 1 else None
