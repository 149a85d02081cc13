"""The answer of an HTTP email API, judged the way an SMTP answer is.

    2xx                       → 200 {"status": "sent", ...}: the same shape as over SMTP
    not-acted statuses        → 502 provider_error, the key is free (408/425/429/503,
                                and what the preset's provider documents)
    unknown statuses          → 502 provider_outcome_unknown / 504 provider_timeout
    other 4xx                 → 422 provider_rejected, stored and replayed (SMTP's 5xx)
    anything else (3xx, 5xx the preset does not name) → unknown: nothing says it did not act
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from gateway.config import HttpProviderConfig
from gateway.effects.fingerprint import message_id
from gateway.providers.base import EmailCall, Outcome, problem_outcome
from gateway.providers.email_apis import EMAIL_APIS, EmailApi
from gateway.wire import ProblemCode

#: how much of a provider's answer is kept in ours (the rest is cut)
ANSWER_EXCERPT = 2000


def api_of(config: HttpProviderConfig) -> EmailApi:
    assert config.email and config.preset is not None and config.preset.email_api, \
        "routes.py sends emails only to providers with an email preset"
    return EMAIL_APIS[config.preset.email_api]


#: how deeply an answer's JSON may nest to be read as JSON: the answers the
#: presets know are a few levels deep; deeper is quoted as text
MAX_ANSWER_DEPTH = 32


def _deeper_than(value: Any, limit: int) -> bool:
    """Whether ``value`` nests more than ``limit`` levels (without recursing)."""
    stack = [(value, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, (dict, list)):
            if depth > limit:
                return True
            stack.extend((v, depth + 1) for v in (item.values() if isinstance(item, dict)
                                                  else item))
    return False


def _parsed(body: bytes) -> Any:
    """The answer's JSON, if it is JSON nested at most ``MAX_ANSWER_DEPTH``
    levels (None otherwise). Nesting past what the parser recurses raises
    RecursionError, not a ValueError: it is an answer that is not the JSON
    expected, after the email was sent or refused, never a gateway error."""
    try:
        parsed = json.loads(body) if body else None
    except (ValueError, UnicodeDecodeError, RecursionError):
        return None
    return None if _deeper_than(parsed, MAX_ANSWER_DEPTH) else parsed


def _excerpt(body: bytes, parsed: Any) -> Any:
    """What of the answer goes into ours: its JSON, or its text, bounded."""
    if parsed is not None and len(body) <= ANSWER_EXCERPT:
        return parsed
    return body[:ANSWER_EXCERPT].decode("utf-8", "replace")


def judge(config: HttpProviderConfig, call: EmailCall, status: int,
          headers: Mapping[str, str], body: bytes) -> Outcome:
    """The effect's outcome from the API's answer."""
    name = config.name
    parsed = _parsed(body)
    answer = _excerpt(body, parsed)
    summary = f"email api {status}"
    if status in config.not_acted_statuses:
        return problem_outcome("free", "provider_error",
                               f"the email provider answered {status}: it did not send the "
                               "email; the key is free again", summary,
                               provider_status=status, provider_answer=answer)
    if status in config.unknown_statuses or not (200 <= status < 300 or 400 <= status < 500):
        code: ProblemCode = "provider_timeout" if status == 504 else "provider_outcome_unknown"
        return problem_outcome("unknown", code,
                               f"the email provider answered {status}, which may come after "
                               "it accepted the email: the outcome is unknown", summary,
                               provider_status=status, provider_answer=answer)
    if status >= 400:
        return problem_outcome("failed", "provider_rejected",
                               f"the email provider refused the email for good: {status}",
                               summary, provider_status=status, provider_answer=answer)
    sent = {"status": "sent", "message_id": message_id(call.client, call.key),
            "provider": name,
            "provider_message_id": api_of(config).message_id(headers, parsed),
            "provider_response": {"status": status, "body": answer}}
    return Outcome("succeeded", 200, json.dumps(sent).encode(),
                   {"Content-Type": "application/json"}, summary)
