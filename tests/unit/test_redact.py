"""One redaction for everything fencegate shows or stores that a caller
wrote: job errors (``last_error``), job payloads and bodies on the console.
Secret-looking fields are blanked at any depth; everything else, and the
shape of the text around a secret, is kept."""

from __future__ import annotations

import json
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from leases.redact import MASK, redact, secret_name
from leases.retry import sanitize_error

SECRET = "sk_live_123"


@pytest.mark.parametrize("name", [
    "api_key", "apiKey", "X-Api-Key", "token", "access_token", "refreshToken", "secret",
    "client_secret", "password", "PASSWD", "Authorization", "private_key", "cookie",
    "credentials"])
def test_secret_looking_names(name: str) -> None:
    assert secret_name(name)


@pytest.mark.parametrize("name", [
    "to", "subject", "max_tokens", "author", "key_count", "monkey", "tokenizer_name",
    "dedupe_key"])
def test_ordinary_names_are_kept(name: str) -> None:
    assert not secret_name(name)


def test_a_payload_is_blanked_at_any_depth_and_kept_otherwise() -> None:
    payload = {"to": "lead@example.com", "api_key": SECRET,
               "crm": {"auth": {"token": "t0p", "user": "bot"}},
               "calls": [{"headers": {"Authorization": "Bearer abc.def"}}, 3, None],
               "note": f"used {SECRET} yesterday"}
    out = redact(payload)
    assert SECRET not in json.dumps(out) and "t0p" not in json.dumps(out)
    assert "abc.def" not in json.dumps(out)
    assert out["to"] == "lead@example.com" and out["crm"]["auth"]["user"] == "bot"
    assert out["api_key"] == MASK and out["calls"][1:] == [3, None]
    assert payload["api_key"] == SECRET  # the input is not changed


@pytest.mark.parametrize(("raw", "expected"), [
    ("RuntimeError: CRM refused (api_key=sk_live_123)", "RuntimeError: CRM refused (api_key=***)"),
    ("failed [token: abc]", "failed [token: ***]"),
    ('payload {"api_key": "sk_live_123", "to": "x"}', 'payload {"api_key": "***", "to": "x"}'),
])
def test_blanking_keeps_the_text_around_the_secret(raw: str, expected: str) -> None:
    assert redact(raw) == expected
    assert sanitize_error(raw) == expected  # errors go through the same function


names = st.sampled_from(["api_key", "token", "password", "secret", "Authorization"])
plain = st.sampled_from(["to", "subject", "id", "body"])
leaf = st.one_of(st.none(), st.integers(), st.just(SECRET), st.text(max_size=5))


def _tree() -> st.SearchStrategy[Any]:
    return st.recursive(leaf, lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.dictionaries(st.one_of(names, plain), inner, max_size=3)), max_leaves=12)


def _secrets_under_names(value: Any, under: bool = False) -> list[Any]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in _secrets_under_names(v, secret_name(k))]
    if isinstance(value, list):
        return [s for v in value for s in _secrets_under_names(v, under)]
    return [value] if under and value is not None else []


@given(_tree())
def test_no_value_under_a_secret_name_survives(value: Any) -> None:
    out = redact(value)
    assert _secrets_under_names(out) == [MASK] * len(_secrets_under_names(out))
    assert SECRET not in json.dumps(out)
    assert redact(out) == out  # idempotent: blanking twice changes nothing


@given(names, st.from_regex(r"[A-Z0-9]{6,20}", fullmatch=True),
       st.sampled_from([")", "]", "}", ",", ";", " ", ""]), st.sampled_from(["=", ": ", " = "]))
def test_a_secret_in_text_is_blanked_up_to_its_end(name: str, value: str, close: str,
                                                    sep: str) -> None:
    """Only the value goes: the name, the separator and whatever closes it stay."""
    text = f"RuntimeError: refused ({name}{sep}{value}{close} after 3 tries"
    assert redact(text) == f"RuntimeError: refused ({name}{sep}{MASK}{close} after 3 tries"


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hostile", [
    "://a:" * 200_000,  # URL credentials begun and never ended by an "@"
    "x=://u:" + "p" * 1_000_000,
])
def test_redaction_is_linear_in_hostile_text(hostile: str) -> None:
    """Text made of URL-credential starts with no "@" after them: the
    credentials pattern scanned to the end from every start, so redacting
    8 KB of it (an HTTP query) took 56 ms, and a megabyte (a job payload on
    the console) a quarter of an hour. Linear, it takes milliseconds."""
    assert redact(hostile) == hostile
    assert redact(hostile + "@h") != hostile + "@h"  # the first start is a credential


@pytest.mark.parametrize("text,shown", [
    ("db refused: password='hunter2", "db refused: password='***"),
    ('token: "abc def', 'token: "***'),
    ("password='a' and secret=\"b c", "password='***' and secret=\"***"),
])
def test_a_quoted_secret_that_never_closes_is_blanked_to_the_end(text: str,
                                                                 shown: str) -> None:
    """A quoted value is blanked up to its closing quote; one whose quote
    never closes (an error message cut short by a library, a subject) was
    kept whole, secret and all."""
    assert redact(text) == shown
