"""The deploy files generated from a source beside them are what their
builders write: a panel added to the dashboard's JSON by hand, or a rule to
rules.yml without rebuilding the PrometheusRule, would be lost at the next
build (make deploy-check says so too, but it is run by hand)."""

from __future__ import annotations

import runpy
from pathlib import Path

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


def built(builder: Path) -> str:
    """What a deploy/*/build.py writes (run as a module: its __main__ block,
    which writes the file, does not run)."""
    return str(runpy.run_path(str(builder))["render"]())


def test_the_dashboard_is_what_its_builder_writes() -> None:
    assert (DEPLOY / "grafana" / "fencegate.json").read_text() == \
        built(DEPLOY / "grafana" / "build.py"), \
        "run deploy/grafana/build.py"


def test_the_prometheus_rule_is_built_from_the_rules() -> None:
    assert (DEPLOY / "kubernetes" / "base" / "prometheusrule.yaml").read_text() == \
        built(DEPLOY / "kubernetes" / "build.py"), \
        "run deploy/kubernetes/build.py"
