"""The deploy files generated from a source beside them are what their
builders write: a panel added to the dashboard's JSON by hand, or a rule to
rules.yml without rebuilding the PrometheusRule, would be lost at the next
build (make deploy-check says so too, but it is run by hand)."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from types import ModuleType

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def builder(path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"build_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_dashboard_is_what_its_builder_writes() -> None:
    built = builder(DEPLOY / "grafana" / "build.py").render()
    assert (DEPLOY / "grafana" / "fencegate.json").read_text() == built, \
        "run deploy/grafana/build.py"


def test_the_prometheus_rule_is_built_from_the_rules() -> None:
    built = builder(DEPLOY / "kubernetes" / "build.py").render()
    assert (DEPLOY / "kubernetes" / "base" / "prometheusrule.yaml").read_text() == built, \
        "run deploy/kubernetes/build.py"
