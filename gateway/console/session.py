"""Who is using the console: an operator's API key, posted once to the login
form, exchanged for a signed session cookie.

- Only clients configured with ``role = "operator"`` get in.
- The key travels once, in a POST body; it is never put in a URL, a cookie or
  the browser's storage. The cookie holds the client's name, the sha256 of the
  key used (so removing that key from the configuration ends its sessions), an
  expiry and a random nonce, signed with HMAC-SHA256. It is ``HttpOnly``,
  ``SameSite=Strict``, ``Path=/console``, and ``Secure`` over HTTPS.
- Every form that acts carries a CSRF token derived from the session's nonce;
  every POST must also come from the console's own origin (``Origin``, or
  ``Sec-Fetch-Site``).

The signing key is ``FENCEGATE_CONSOLE_SECRET`` when set (the same on every
gateway instance behind one load balancer), else a random one made by
``fencegate serve`` and shared by its processes: a restart logs operators out.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

from aiohttp import web

from gateway.api.auth import key_sha256
from gateway.config import ClientConfig, Config

SECRET_ENV = "FENCEGATE_CONSOLE_SECRET"
COOKIE = "fencegate_console"
COOKIE_PATH = "/console"
SESSION_SECONDS = 8 * 3600
SECRET_KEY = web.AppKey("console_secret", bytes)


def secret_for_processes() -> bytes:
    """The signing key: ``FENCEGATE_CONSOLE_SECRET``, or one made now and put
    in the environment, where processes started later (``serve --workers``)
    find it."""
    value = os.environ.get(SECRET_ENV)
    if not value:
        value = secrets.token_urlsafe(32)
        os.environ[SECRET_ENV] = value
    return hashlib.sha256(b"fencegate console session\0" + value.encode()).digest()


@dataclass(frozen=True)
class Session:
    client: str
    key_hash: str
    expires: int
    nonce: str

    def csrf(self, secret: bytes) -> str:
        return _mac(secret, f"csrf\0{self.nonce}")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode().rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))


def _mac(secret: bytes, message: str) -> str:
    return _b64(hmac.new(secret, message.encode(), hashlib.sha256).digest())


def seal(session: Session, secret: bytes) -> str:
    body = _b64(json.dumps([session.client, session.key_hash, session.expires,
                            session.nonce]).encode())
    return f"{body}.{_mac(secret, body)}"


def unseal(value: str, secret: bytes, now: float) -> Session | None:
    """The session in a cookie, if its signature holds and it has not expired
    (a cookie we sealed is ASCII; one that is not, bytes that are not UTF-8
    among them, is no session)."""
    if not value.isascii():
        return None
    body, _, mac = value.partition(".")
    if not hmac.compare_digest(mac.encode(), _mac(secret, body).encode()):
        return None
    try:
        client, key_hash, expires, nonce = json.loads(_unb64(body))
        session = Session(str(client), str(key_hash), int(expires), str(nonce))
    except (ValueError, TypeError):
        return None
    return session if session.expires > now else None


def operator_for_key(config: Config, api_key: str) -> ClientConfig | None:
    """The operator client whose key this is; None for an unknown key or a
    client that is not an operator."""
    digest = key_sha256(api_key.strip())
    for client in config.clients:
        if digest in client.keys_sha256:
            return client if client.role == "operator" else None
    return None


def current(request: web.Request, config: Config) -> tuple[Session, ClientConfig] | None:
    """The operator behind this request's cookie, if the session is valid and
    the client is still an operator with that key."""
    value = request.cookies.get(COOKIE)
    if not value:
        return None
    session = unseal(value, request.app[SECRET_KEY], time.time())
    if session is None:
        return None
    for client in config.clients:
        if client.name == session.client:
            if client.role == "operator" and session.key_hash in client.keys_sha256:
                return session, client
            return None
    return None


def start(response: web.StreamResponse, request: web.Request, client: ClientConfig,
          api_key: str) -> Session:
    session = Session(client.name, key_sha256(api_key.strip()),
                      int(time.time()) + SESSION_SECONDS, secrets.token_urlsafe(16))
    response.set_cookie(COOKIE, seal(session, request.app[SECRET_KEY]), path=COOKIE_PATH,
                        max_age=SESSION_SECONDS, httponly=True, samesite="Strict",
                        secure=request.secure)
    return session


def end(response: web.StreamResponse) -> None:
    response.del_cookie(COOKIE, path=COOKIE_PATH)


def same_origin(request: web.Request) -> bool:
    """A POST made by the console's own pages (browsers send ``Origin`` on
    every POST; ``Sec-Fetch-Site`` where they do not). A POST naming neither
    is refused: it did not come from a browser showing the console."""
    origin = request.headers.get("Origin")
    if origin is not None and origin != "null":  # the host only: a TLS proxy's scheme differs
        return urlsplit(origin).netloc == request.host
    # no Origin, or "null" (a page whose referrer policy hides it)
    return request.headers.get("Sec-Fetch-Site") == "same-origin"


def csrf_ok(session: Session, secret: bytes, token: str | None) -> bool:
    return token is not None and hmac.compare_digest(token.encode(),
                                                     session.csrf(secret).encode())
