"""Reading the configuration file: the contract's TOML, validated when the
process starts, into gateway/config/model.py's dataclasses. Every error names
the file and the key that is wrong."""

from __future__ import annotations

import tomllib
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from gateway.config import fill
from gateway.config.model import (
    _NAME,
    _SHA256,
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
    ROLES,
    ClientConfig,
    Config,
    HttpProviderConfig,
    ProviderConfig,
    ServerConfig,
    SmtpProviderConfig,
)
from gateway.config.presets import (
    DEFAULT_NOT_ACTED_STATUSES,
    DEFAULT_UNKNOWN_STATUSES,
    Preset,
)
from gateway.config.reader import Reader as _Reader
from gateway.errors import ConfigError
from gateway.signing import signing_key


def _server(source: str, raw: Any) -> ServerConfig:
    r = _Reader(source, "server", raw)
    r.check_unknown({"host", "port", "max_body_bytes", "effect_retention_seconds",
                     "database_timeout_seconds", "body_timeout_seconds",
                     "barrier_grace_seconds", "max_requests_in_flight"})
    return ServerConfig(
        host=r.get("host", str, DEFAULT_HOST),
        port=int(r.number("port", DEFAULT_PORT, 0, 65535)),
        max_body_bytes=int(r.number("max_body_bytes", DEFAULT_MAX_BODY_BYTES, 1, 2**31)),
        effect_retention_seconds=r.number(
            "effect_retention_seconds", DEFAULT_RETENTION_SECONDS, 60, 10 * 365 * 86400
        ),
        database_timeout_seconds=r.number(
            "database_timeout_seconds", DEFAULT_DATABASE_TIMEOUT_SECONDS, 0.1, 300
        ),
        body_timeout_seconds=r.number(
            "body_timeout_seconds", DEFAULT_BODY_TIMEOUT_SECONDS, 0.1, 3600
        ),
        barrier_grace_seconds=r.number(
            "barrier_grace_seconds", DEFAULT_BARRIER_GRACE_SECONDS, 0.5, 3600
        ),
        max_requests_in_flight=int(r.number("max_requests_in_flight", 0, 0, 1_000_000)),
    )


def _client(source: str, index: int, raw: Any) -> ClientConfig:
    r = _Reader(source, f"clients[{index}]", raw)
    r.check_unknown({"name", "key_sha256", "key_sha256_env", "resources", "role",
                     "providers", "provider_paths"})
    name = r.get("name", str, required=True)
    if not _NAME.fullmatch(name):
        raise r.error("name", "must be 1 to 64 of A-Z a-z 0-9 _ -")
    keys = _client_keys(r)
    resources = r.get("resources", list, required=True)
    if not resources or not all(isinstance(p, str) and p for p in resources):
        raise r.error("resources", "must be a non-empty list of patterns such as \"run:*\"")
    role = r.get("role", str, "worker")
    if role not in ROLES:
        raise r.error("role", 'must be "worker" or "operator"')
    providers = r.get("providers", list, None)
    if providers is not None and (not providers or not all(
            isinstance(p, str) and p for p in providers)):
        raise r.error("providers", "must be a non-empty list of provider names")
    paths = r.get("provider_paths", dict, {})
    prefixes: dict[str, tuple[str, ...]] = {}
    for provider, found in paths.items():
        if not isinstance(found, list) or not found or not all(
                isinstance(p, str) and _plain_prefix(p) for p in found):
            raise r.error("provider_paths", f"{provider!r} must be a non-empty list of "
                          "path prefixes such as \"v3/objects/contacts\" (no \".\" or "
                          "\"..\" segments)")
        prefixes[provider] = tuple(p.strip("/") for p in found)
    return ClientConfig(name, keys[0], tuple(resources), keys[1:], role,
                        tuple(providers) if providers is not None else None, prefixes)


def _plain_prefix(prefix: str) -> bool:
    segments = prefix.strip("/").split("/")
    return all(seg and seg.strip(". ") and seg.isprintable() for seg in segments)


def _check_client_providers(source: str, index: int, client: ClientConfig,
                            providers: Mapping[str, ProviderConfig]) -> None:
    """A client's ``providers`` and ``provider_paths`` name configured
    providers (``provider_paths`` only HTTP ones, among those it may use)."""
    r = _Reader(source, f"clients[{index}]", {})
    for name in client.providers or ():
        if name not in providers:
            raise r.error("providers", f"{name!r} is not a configured provider")
    for name in client.provider_paths:
        provider = providers.get(name)
        if provider is None or provider.kind != "http":
            raise r.error("provider_paths", f"{name!r} is not a configured http provider")
        if not client.may_use(name):
            raise r.error("provider_paths", f"{name!r} is not in this client's providers")


def _client_keys(r: _Reader) -> tuple[str, ...]:
    """``key_sha256`` (one hash, or a list: rotation) or ``key_sha256_env`` (an
    environment variable holding hashes separated by commas or spaces)."""
    if ("key_sha256" in r.table) == ("key_sha256_env" in r.table):
        raise r.error("key_sha256", "give either key_sha256 or key_sha256_env")
    if "key_sha256" in r.table:
        where, raw = "key_sha256", r.get("key_sha256", (str, list))
        found = [raw] if isinstance(raw, str) else raw
    else:
        where, env = "key_sha256_env", r.secret("key_sha256_env")
        found = (env or "").replace(",", " ").split()
    keys = tuple(k.lower() for k in found if isinstance(k, str))
    if not keys or len(keys) != len(found) or not all(_SHA256.fullmatch(k) for k in keys):
        raise r.error(where, "must be 64 hex digits (sha256 of the API key), or several")
    if len(set(keys)) != len(keys):
        raise r.error(where, "repeats a key")
    return keys


_COMMON = {"kind", "timeout_seconds", "rate_limit_per_second", "idempotency_header",
           "idempotency_window_seconds"}
_SMTP = {"host", "port", "tls", "username_env", "password_env", "pool_size", "ca_file",
         "allow_plaintext_auth"}
_HTTP = {"base_url", "signing_secret_env", "authorization_env", "resend_attempts"}


def _provider(source: str, name: str, raw: Any) -> ProviderConfig:
    r = _Reader(source, f"providers.{name}", raw)
    if not _NAME.fullmatch(name):
        raise r.error("", "provider names must be 1 to 64 of A-Z a-z 0-9 _ -")
    kind = r.get("kind", str, required=True)
    if kind not in ("smtp", "http"):
        raise r.error("kind", 'must be "smtp" or "http"')
    preset = fill.preset_of(r, kind)
    r.check_unknown(_COMMON | (_SMTP if kind == "smtp" else _HTTP)
                    | fill.preset_keys(preset))
    header, window = fill.idempotency(r, kind, preset,
                                                DEFAULT_HTTP_IDEMPOTENCY_HEADER)
    common: dict[str, Any] = {
        "name": name,
        "timeout_seconds": r.number("timeout_seconds", DEFAULT_TIMEOUT_SECONDS, 0.01, 3600),
        "rate_limit_per_second": r.number(
            "rate_limit_per_second", DEFAULT_RATE_LIMIT_PER_SECOND, 0.001, 1e6
        ),
        "idempotency_header": header,
        "idempotency_window_seconds": window,
    }
    if kind == "smtp":
        return _smtp(r, common, preset)
    return _http(r, common, preset)


def _http(r: _Reader, common: dict[str, Any], preset: Preset | None) -> HttpProviderConfig:
    settings: dict[str, Any] = {}
    if preset is not None:
        settings = fill.http_settings(r, preset)
    else:
        authorization = r.secret("authorization_env")
        settings["auth_headers"] = {"Authorization": authorization} if authorization else {}
    base_url = settings.pop("base_url", None) or r.get("base_url", str, required=True)
    parts = urlsplit(base_url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise r.error("base_url", "must be an absolute http:// or https:// URL")
    if parts.query or parts.fragment:
        raise r.error("base_url", "must not have a query or a fragment")
    secret = r.secret("signing_secret_env")
    if secret is not None:
        try:
            signing_key(secret)
        except ValueError:
            raise r.error("signing_secret_env", "names a secret that is not base64 (with or "
                          "without the whsec_ prefix), as Standard Webhooks secrets are") \
                from None
    resend_attempts = int(r.number("resend_attempts", DEFAULT_RESEND_ATTEMPTS, 0,
                                   MAX_RESEND_ATTEMPTS))
    if common["idempotency_header"] and common["idempotency_window_seconds"] > 0:
        # a provider that dedupes on our key answers 409 to a request whose key
        # an earlier attempt still holds (the IETF Idempotency-Key draft,
        # Stripe, Resend): that attempt may act yet, so the outcome is unknown
        settings["unknown_statuses"] = \
            settings.get("unknown_statuses", DEFAULT_UNKNOWN_STATUSES) | {CONFLICT}
        settings["not_acted_statuses"] = \
            settings.get("not_acted_statuses", DEFAULT_NOT_ACTED_STATUSES) - {CONFLICT}
    return HttpProviderConfig(**common, base_url=base_url.rstrip("/"), signing_secret=secret,
                              resend_attempts=resend_attempts, **settings)


def _smtp(r: _Reader, common: dict[str, Any], preset: Preset | None) -> SmtpProviderConfig:
    filled = fill.smtp_settings(r, preset) if preset is not None else {}
    tls = r.get("tls", str, filled.get("tls", "none"))
    if tls not in ("none", "starttls", "tls"):
        raise r.error("tls", 'must be "none", "starttls" or "tls"')
    username = filled.get("username") or r.secret("username_env")
    password = filled.get("password") or r.secret("password_env")
    if tls == "none" and (username or password) and not r.get("allow_plaintext_auth", bool):
        raise r.error("tls", '"none" would send the SMTP password in clear text: use '
                      '"starttls" or "tls", or set allow_plaintext_auth = true (a relay on '
                      "loopback)")
    default_port = filled.get("port") or (465 if tls == "tls" else 25)
    return SmtpProviderConfig(
        **common,
        preset=preset,
        host=r.get("host", str, filled.get("host"), required="host" not in filled),
        port=int(r.number("port", default_port, 1, 65535)),
        tls=tls,
        username=username,
        password=password,
        pool_size=int(r.number("pool_size", DEFAULT_SMTP_POOL_SIZE, 1, 256)),
        ca_file=_existing_file(r, "ca_file"),
    )


def _existing_file(r: _Reader, key: str) -> str | None:
    path = r.get(key, str)
    if path is not None and not Path(path).is_file():
        raise r.error(key, f"{path} is not a readable file")
    return str(path) if path is not None else None


def parse(data: dict[str, Any], source: str = "<memory>") -> Config:
    """Validate a parsed TOML document into a ``Config``."""
    top = _Reader(source, "", data)
    top.check_unknown({"server", "database", "clients", "providers"})
    server = _server(source, data.get("server", {}))
    db = _Reader(source, "database", data.get("database", {}))
    db.check_unknown({"url_env", "pool_size"})
    clients = tuple(_client(source, i, c)
                    for i, c in enumerate(top.get("clients", list, [])))
    names = [c.name for c in clients]
    if len(set(names)) != len(names):
        raise top.error("clients", "client names must be unique")
    hashes = [k for c in clients for k in c.keys_sha256]
    if len(set(hashes)) != len(hashes):
        raise top.error("clients", "two clients share one API key")
    raw_providers = top.get("providers", dict, {})
    providers = {name: _provider(source, name, raw) for name, raw in raw_providers.items()}
    for index, client in enumerate(clients):
        _check_client_providers(source, index, client, providers)
    return Config(server, db.get("url_env", str, DEFAULT_DATABASE_URL_ENV), clients,
                  providers, source,
                  int(db.number("pool_size", DEFAULT_DATABASE_POOL_SIZE, 2, 1000)))


def load(path: str | Path) -> Config:
    """Read and validate the TOML file at ``path``."""
    path = Path(path)
    try:
        with path.open("rb") as f:
            data = tomllib.load(f)
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML: {exc}") from None
    return parse(data, str(path))
