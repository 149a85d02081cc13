"""Which providers the gateway resends to within a request, and how it
backs off between resends (gateway/effects/resend.py): pure rules."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway import config as gconfig
from gateway.effects.resend import RESEND_BACKOFF_CAP_SECONDS, policy, resendable
from gateway.errors import ConfigError


def _provider(**keys: Any) -> gconfig.ProviderConfig:
    table = {"kind": "http", "base_url": "http://127.0.0.1:9/api", **keys}
    return gconfig.parse({"providers": {"p": table}}).providers["p"]


def test_only_an_http_provider_that_dedupes_for_a_window_resends() -> None:
    assert resendable(_provider(idempotency_window_seconds=86400))
    assert not resendable(_provider(idempotency_window_seconds=86400, resend_attempts=0))
    assert not resendable(_provider())  # the header, but no window
    assert not resendable(_provider(idempotency_header="", idempotency_window_seconds=60))
    smtp = gconfig.parse({"providers": {"m": {
        "kind": "smtp", "host": "127.0.0.1", "idempotency_header": "Resend-Idempotency-Key",
        "idempotency_window_seconds": 86400}}}).providers["m"]
    assert not resendable(smtp)


def test_resend_attempts_is_checked_when_the_file_is_read() -> None:
    with pytest.raises(ConfigError, match=r"providers\.p\.resend_attempts: must be between"):
        _provider(resend_attempts=11)
    with pytest.raises(ConfigError, match=r"providers\.m\.resend_attempts: is not a known key"):
        gconfig.parse({"providers": {"m": {"kind": "smtp", "host": "h",
                                           "resend_attempts": 1}}})


def test_resends_back_off_with_jitter_within_the_cap() -> None:
    config = _provider(idempotency_window_seconds=86400, resend_attempts=5)
    assert isinstance(config, gconfig.HttpProviderConfig)
    rules, rng = policy(config), random.Random(7)
    for n in range(1, 6):
        step = min(RESEND_BACKOFF_CAP_SECONDS, 0.5 * 2 ** (n - 1))
        assert step / 2 <= rules.backoff(n, rng) <= step


def test_a_provider_that_dedupes_reads_409_as_unknown() -> None:
    """409 from a provider that dedupes: an earlier attempt still holds our
    key there, so the outcome is unknown, not a failure."""
    dedupes = _provider(idempotency_window_seconds=86400)
    assert isinstance(dedupes, gconfig.HttpProviderConfig)
    assert 409 in dedupes.unknown_statuses and 409 not in dedupes.not_acted_statuses
    plain = _provider(idempotency_header="")
    assert isinstance(plain, gconfig.HttpProviderConfig)
    assert 409 not in plain.unknown_statuses  # a business conflict: a definite answer


def test_the_window_covers_only_the_endpoints_a_preset_says_dedupe(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Resend dedupes on POST /emails and POST /emails/batch only: no other
    endpoint is in the window, so nothing else is resent."""
    monkeypatch.setenv("RESEND_API_KEY", "re_test")
    resend = gconfig.parse({"providers": {"r": {"kind": "http", "preset": "resend"}}}
                           ).providers["r"]
    assert resend.retry_window_for("POST", "emails") == 86400
    assert resend.retry_window_for("post", "/emails/batch/") == 86400
    assert resend.retry_window_for("POST", "broadcasts/b-1/send") == 0
    assert resend.retry_window_for("GET", "emails") == 0
    generic = _provider(idempotency_window_seconds=60)  # no preset: every request
    assert generic.retry_window_for("DELETE", "anything/at/all") == 60


def test_a_path_with_empty_segments_is_not_the_deduplicated_endpoint(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """``emails//`` or ``//emails`` reaches the provider as a path of its own,
    which its deduplication does not cover: such a path gets no window, so an
    unknown outcome there is never resent (issue 21). One slash at either end
    is still the endpoint itself."""
    monkeypatch.setenv("RESEND_API_KEY", "re_test")
    resend = gconfig.parse({"providers": {"r": {"kind": "http", "preset": "resend"}}}
                           ).providers["r"]
    for path in ("emails//", "//emails", "emails//batch", "/emails/batch//", "emails/%2F"):
        assert resend.retry_window_for("POST", path) == 0, path
    assert resend.retry_window_for("POST", "/emails/") == 86400
