"""A gateway that is told to stop finishes every effect it admitted, and the
platform waits for it (issue 21): aiohttp's shutdown timeout covers the
longest request (every attempt's budget and the backoffs between resends),
and the Kubernetes pod's terminationGracePeriodSeconds covers the preStop
pause plus that. A gateway killed before an effect ended resets its provider
connections (nothing more is delivered), but the effect's outcome is then
unknown: the rollout itself must not cause that."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from gateway import config as gconfig
from gateway import serve
from gateway.effects import resend

ROOT = Path(__file__).resolve().parents[2]


def test_the_longest_request_counts_every_attempt_and_backoff() -> None:
    c = gconfig.parse({"providers": {
        "crm": {"kind": "http", "base_url": "https://crm.example", "timeout_seconds": 10,
                "idempotency_header": "Idempotency-Key", "idempotency_window_seconds": 3600},
        "hook": {"kind": "http", "base_url": "https://hook.example", "timeout_seconds": 20,
                 "idempotency_header": ""}}})
    # 3 attempts of 5 + 10 s, backoffs of at most 0.5 and 1 s
    assert resend.longest_effect_seconds(c.server, c.providers["crm"]) == 46.5
    # never resent: one attempt
    assert resend.longest_effect_seconds(c.server, c.providers["hook"]) == 25
    assert serve.shutdown_seconds(c) == 46.5 + serve.SHUTDOWN_MARGIN_SECONDS


def test_kubernetes_waits_for_the_gateway_to_finish_its_effects(
        monkeypatch: pytest.MonkeyPatch) -> None:
    base = ROOT / "deploy" / "kubernetes" / "base"
    docs = list(yaml.safe_load_all((base / "deployment.yaml").read_text()))
    [deployment] = [d for d in docs if d and d.get("kind") == "Deployment"]
    pod = deployment["spec"]["template"]["spec"]
    [gateway] = [c for c in pod["containers"] if c["name"] == "gateway"]
    command = gateway["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    # the example overlay's configuration (the one the pod runs), and one
    # HTTP provider that dedupes, with every default: the longest request
    overlay = ROOT / "deploy" / "kubernetes" / "overlays" / "example"
    for line in (overlay / "secrets.env").read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, value = line.partition("=")
            monkeypatch.setenv(name.strip(), value.strip())
    defaults = gconfig.parse({"providers": {"crm": {
        "kind": "http", "base_url": "https://crm.example",
        "idempotency_header": "Idempotency-Key", "idempotency_window_seconds": 86400}}})
    for config in (gconfig.load(overlay / "gateway.toml"), defaults):
        needed = float(command[1]) + serve.shutdown_seconds(config)
        assert pod["terminationGracePeriodSeconds"] >= needed, (config.source, needed)
