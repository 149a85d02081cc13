"""Several API keys for one client (rotation without downtime), given inline or
from an environment variable (a Kubernetes Secret)."""

from __future__ import annotations

import copy
import re
from typing import Any

import pytest

from gateway import config
from gateway.api.auth import Authenticator, key_sha256
from gateway.api.problems import Problem

OLD, NEW = key_sha256("old-key"), key_sha256("new-key")
BASE: dict[str, Any] = {
    "clients": [{"name": "agents", "resources": ["run:*"]},
                {"name": "other", "key_sha256": key_sha256("other-key"),
                 "resources": ["other:*"]}],
}


def parse(**client: Any) -> config.Config:
    data = copy.deepcopy(BASE)
    data["clients"][0].update(client)
    return config.parse(data, "gw.toml")


@pytest.mark.parametrize("keys", [
    {"key_sha256": [NEW, OLD.upper()]},
    {"key_sha256_env": "FENCEGATE_TEST_AGENTS_KEYS"},
])
def test_both_keys_of_a_client_authenticate_as_that_client(
    keys: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FENCEGATE_TEST_AGENTS_KEYS", f"{NEW},\n {OLD}")
    c = parse(**keys)
    assert c.clients[0].keys_sha256 == (NEW, OLD)
    auth = Authenticator(c.clients)
    assert auth.client("Bearer new-key").name == auth.client("Bearer old-key").name == "agents"
    assert auth.client("Bearer other-key").name == "other"
    with pytest.raises(Problem):
        auth.client("Bearer retired-key")


def test_one_key_still_reads_as_before() -> None:
    c = parse(key_sha256=OLD)
    assert c.clients[0].key_sha256 == OLD and c.clients[0].keys_sha256 == (OLD,)


@pytest.mark.parametrize(("keys", "message"), [
    ({}, "clients[0].key_sha256: give either"),
    ({"key_sha256": OLD, "key_sha256_env": "X"}, "clients[0].key_sha256: give either"),
    ({"key_sha256": []}, "clients[0].key_sha256: must be 64 hex"),
    ({"key_sha256": [OLD, "short"]}, "clients[0].key_sha256: must be 64 hex"),
    ({"key_sha256": [OLD, 7]}, "clients[0].key_sha256: must be 64 hex"),
    ({"key_sha256": [OLD, OLD]}, "clients[0].key_sha256: repeats a key"),
    ({"key_sha256": [OLD, key_sha256("other-key")]}, "clients: two clients share"),
    ({"key_sha256_env": "FENCEGATE_TEST_UNSET_VAR"}, "which is not set"),
    ({"key_sha256_env": "FENCEGATE_TEST_EMPTY_KEYS"}, "key_sha256_env: must be 64 hex"),
])
def test_bad_keys_are_refused_naming_the_key(
    keys: dict[str, Any], message: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FENCEGATE_TEST_EMPTY_KEYS", " ")
    with pytest.raises(config.ConfigError, match=re.escape(message)):
        parse(**keys)
