"""What an email API module offers: a request builder, and where the
provider's message id is in its answer."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gateway.api.email_body import addr_spec
from gateway.config import HttpProviderConfig
from gateway.providers.base import EmailCall


@dataclass(frozen=True)
class ApiRequest:
    """One request to an email API, before the gateway's own headers."""

    path: str  #: under the provider's base URL, already percent-encoded
    body: bytes
    content_type: str
    headers: dict[str, str] = field(default_factory=dict)
    method: str = "POST"


#: the provider's message id, from its answer's headers and (parsed) body
MessageIdOf = Callable[[Mapping[str, str], Any], str | None]
@dataclass(frozen=True)
class EmailApi:
    build: Callable[[EmailCall, HttpProviderConfig], Awaitable[ApiRequest]]
    message_id: MessageIdOf


def json_body(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":")).encode()


def bare(address: str) -> str:
    """``Name <addr>`` → ``addr``: the addr-spec requests.py validated."""
    return addr_spec(address)


def field_of(body: Any, name: str) -> str | None:
    """A string field of a JSON object answer, if it is there."""
    value = body.get(name) if isinstance(body, dict) else None
    return value if isinstance(value, str) and value else None
