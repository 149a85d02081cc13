"""The gateway's configuration: the contract's TOML, validated when the
process starts (read.py), into what a configuration is (model.py); presets
(presets.py) fill in what a provider's table leaves out (fill.py).

Every error names the file and the key that is wrong.
"""

from gateway.config.model import (
    CONFLICT,
    DEFAULT_BARRIER_GRACE_SECONDS,
    DEFAULT_BODY_TIMEOUT_SECONDS,
    DEFAULT_DATABASE_POOL_SIZE,
    DEFAULT_DATABASE_TIMEOUT_SECONDS,
    DEFAULT_DATABASE_URL_ENV,
    DEFAULT_HOST,
    DEFAULT_HTTP_IDEMPOTENCY_HEADER,
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_PORT,
    DEFAULT_RATE_LIMIT_PER_SECOND,
    DEFAULT_RESEND_ATTEMPTS,
    DEFAULT_RETENTION_SECONDS,
    DEFAULT_SMTP_POOL_SIZE,
    DEFAULT_TIMEOUT_SECONDS,
    MAX_RESEND_ATTEMPTS,
    REQUESTS_PER_CONNECTION,
    ROLES,
    ClientConfig,
    Config,
    HttpProviderConfig,
    ProviderConfig,
    Role,
    ServerConfig,
    SmtpProviderConfig,
)
from gateway.config.read import load, parse
from gateway.errors import ConfigError
from gateway.signing import signing_key

__all__ = [
    "CONFLICT",
    "DEFAULT_BARRIER_GRACE_SECONDS",
    "DEFAULT_BODY_TIMEOUT_SECONDS",
    "DEFAULT_DATABASE_POOL_SIZE",
    "DEFAULT_DATABASE_TIMEOUT_SECONDS",
    "DEFAULT_DATABASE_URL_ENV",
    "DEFAULT_HOST",
    "DEFAULT_HTTP_IDEMPOTENCY_HEADER",
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_PORT",
    "DEFAULT_RATE_LIMIT_PER_SECOND",
    "DEFAULT_RESEND_ATTEMPTS",
    "DEFAULT_RETENTION_SECONDS",
    "DEFAULT_SMTP_POOL_SIZE",
    "DEFAULT_TIMEOUT_SECONDS",
    "MAX_RESEND_ATTEMPTS",
    "REQUESTS_PER_CONNECTION",
    "ROLES",
    "ClientConfig",
    "Config",
    "ConfigError",
    "HttpProviderConfig",
    "ProviderConfig",
    "Role",
    "ServerConfig",
    "SmtpProviderConfig",
    "load",
    "parse",
    "signing_key",
]
