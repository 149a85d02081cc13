"""Which providers the gateway resends to within a request, and how it
backs off between resends (gateway/resend.py): pure rules."""

from __future__ import annotations

import random
from typing import Any

import pytest

from gateway import config as gconfig
from gateway.errors import ConfigError
from gateway.resend import RESEND_BACKOFF_CAP_SECONDS, policy, resendable


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
