"""Everything in deploy/ that can be checked without Docker or a cluster,
checked with real tools (make deploy-check runs this, then scrape.py).

- yamllint over every YAML file in deploy/;
- the Kubernetes base and example overlay rendered by `kubectl kustomize`,
  validated by kubernetes-validate (--strict, two Kubernetes versions); the two
  Prometheus Operator resources, which it has no schema for, checked here: the
  PrometheusRule's rules by promtool, the ServiceMonitor against the Service;
- every gateway.toml (compose, base, overlay) loaded by fencegate's own
  configuration loader, with the environment its Secret or env file gives;
- the Dockerfile's essentials read with dockerfile-parse, and its build stage's
  install steps executed on this machine (with this machine's Python);
- compose.yaml by Debian's docker-compose (`config`), its Prometheus config by
  `promtool check config`;
- the systemd units by `systemd-analyze verify` and `security --offline`;
- the rules by `promtool check rules` and `promtool test rules`, each alert
  with a test and a section in docs/operations.md;
- generated files (PrometheusRule, Grafana dashboard) equal to their generators'
  output.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import yaml
from dockerfile_parse import DockerfileParser

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
sys.path.insert(0, str(ROOT))

from gateway import config as gateway_config  # noqa: E402

KUBERNETES = DEPLOY / "kubernetes"
KUBERNETES_VERSIONS = ("1.29.0", "1.37.0")
CRD_KINDS = {"PrometheusRule", "ServiceMonitor"}
BIN = Path(sys.executable).parent


class CheckFailed(Exception):
    pass


def generator(path: Path) -> ModuleType:
    """A generator script (deploy/*/build.py) as a module."""
    spec = importlib.util.spec_from_file_location(f"build_{path.parent.name}", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def run(*argv: str | Path, cwd: Path = ROOT, env: dict[str, str] | None = None,
        quiet_ok: bool = False) -> str:
    """Run a tool; its output. Fails on a non-zero exit, or (``quiet_ok``) on
    any output at all (tools that only warn, such as systemd-analyze verify)."""
    out = subprocess.run([str(a) for a in argv], cwd=cwd, capture_output=True, text=True,
                         env=env, timeout=300)
    text = out.stdout + out.stderr
    if out.returncode != 0 or (quiet_ok and text.strip()):
        raise CheckFailed(f"{shlex.join(str(a) for a in argv)} (exit {out.returncode}):\n"
                          f"{text.strip()}")
    return text


def tool(name: str) -> str:
    found = shutil.which(name) or shutil.which(name, path=str(BIN))
    if found is None:
        raise CheckFailed(f"{name} is not installed (deploy/check/tools.sh installs it)")
    return found


# ---- YAML -----------------------------------------------------------------

def check_yamllint() -> str:
    files = sorted(p for p in DEPLOY.rglob("*") if p.suffix in (".yml", ".yaml"))
    run(tool("yamllint"), "--strict", "-c", DEPLOY / ".yamllint", *files)
    return f"{len(files)} files"


# ---- Kubernetes -------------------------------------------------------------

def rendered(directory: Path) -> list[dict[str, Any]]:
    text = run(tool("kubectl"), "kustomize", directory)
    return [d for d in yaml.safe_load_all(text) if d]


def by_kind(docs: list[dict[str, Any]], kind: str) -> list[dict[str, Any]]:
    return [d for d in docs if d["kind"] == kind]


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [doc] = by_kind(docs, kind)
    return doc


def check_kubernetes_validate() -> str:
    seen = []
    for name, directory in (("base", KUBERNETES / "base"),
                            ("overlay", KUBERNETES / "overlays" / "example")):
        docs = rendered(directory)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"{name}.yaml"
            path.write_text(yaml.safe_dump_all(docs))
            for version in KUBERNETES_VERSIONS:
                out = run(tool("kubernetes-validate"), "--strict", "-k", version, path)
                for line in out.splitlines():
                    if line.startswith("INFO") and "passed" in line:
                        continue
                    crd = re.search(r"schema for kind (\w+) with api version "
                                    r"monitoring\.coreos\.com/v1", line)
                    if crd and crd.group(1) in CRD_KINDS:
                        continue  # checked by check_prometheus_operator
                    raise CheckFailed(f"{name} (Kubernetes {version}): {line}")
        seen.append(f"{name}: {len(docs)} resources")
    return "; ".join(seen) + f"; Kubernetes {' and '.join(KUBERNETES_VERSIONS)}"


def probe_path(container: dict[str, Any], probe: str) -> str | None:
    return container.get(probe, {}).get("httpGet", {}).get("path")


def pod_problems(docs: list[dict[str, Any]]) -> list[str]:
    pod = one(docs, "Deployment")["spec"]["template"]
    [gateway] = pod["spec"]["containers"]
    problems = []
    if gateway["args"][:1] != ["serve"]:
        problems.append("the Deployment does not run `fencegate serve`")
    if probe_path(gateway, "readinessProbe") != "/readyz":
        problems.append("readiness is not /readyz")
    if probe_path(gateway, "livenessProbe") != "/healthz":
        problems.append("liveness is not /healthz")
    if not gateway.get("resources", {}).get("requests"):
        problems.append("no resource requests")
    if not pod["spec"]["securityContext"].get("runAsNonRoot"):
        problems.append("the pod may run as root")
    if not gateway["securityContext"].get("readOnlyRootFilesystem"):
        problems.append("the root filesystem is writable")
    [job] = by_kind(docs, "Job")
    migrate = job["spec"]["template"]["spec"]["containers"][0]
    if migrate["args"] != ["migrate"]:
        problems.append("the Job does not run `fencegate migrate`")
    secret_names = {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
    for container in (gateway, migrate):
        for source in container.get("envFrom", []):
            if source["secretRef"]["name"] not in secret_names:
                problems.append(f"{container['name']} reads a Secret that is not rendered")
    return problems


def selector_problems(docs: list[dict[str, Any]]) -> list[str]:
    labels = one(docs, "Deployment")["spec"]["template"]["metadata"]["labels"]

    def selects(selector: dict[str, str]) -> bool:
        return all(labels.get(k) == v for k, v in selector.items())

    problems = []
    if not selects(one(docs, "PodDisruptionBudget")["spec"]["selector"]["matchLabels"]):
        problems.append("the PodDisruptionBudget selects no gateway pod")
    if not selects(one(docs, "Service")["spec"]["selector"]):
        problems.append("the Service selects no gateway pod")
    policy = one(docs, "NetworkPolicy")["spec"]
    if "Egress" not in policy["policyTypes"] or not selects(policy["podSelector"]["matchLabels"]):
        problems.append("the NetworkPolicy does not restrict the gateways' egress")
    egress_ports = {p["port"] for rule in policy["egress"] for p in rule.get("ports", [])}
    if not {53, 5432} <= egress_ports:
        problems.append(f"egress lacks DNS or PostgreSQL: {sorted(egress_ports)}")
    return problems


def check_kubernetes_essentials() -> str:
    docs = rendered(KUBERNETES / "overlays" / "example")
    problems = pod_problems(docs) + selector_problems(docs)
    if problems:
        raise CheckFailed("; ".join(problems))
    return "probes, requests, non-root, PDB/Service/NetworkPolicy selectors, Secret names"


def check_prometheus_operator() -> str:
    docs = rendered(KUBERNETES / "overlays" / "example")
    kubernetes_build = generator(KUBERNETES / "build.py")
    if (KUBERNETES / "base" / "prometheusrule.yaml").read_text() != kubernetes_build.render():
        raise CheckFailed("base/prometheusrule.yaml is stale: run deploy/kubernetes/build.py")
    rule = one(docs, "PrometheusRule")
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "prometheusrule.rules.yml"
        path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
        run(tool("promtool"), "check", "rules", path)
    monitor = one(docs, "ServiceMonitor")["spec"]
    service = one(docs, "Service")
    labels = service["metadata"]["labels"]
    problems = []
    if not all(labels.get(k) == v for k, v in monitor["selector"]["matchLabels"].items()):
        problems.append("the ServiceMonitor selects no Service")
    ports = {p["name"] for p in service["spec"]["ports"]}
    for endpoint in monitor["endpoints"]:
        if endpoint.get("port") not in ports or endpoint.get("path") != "/metrics":
            problems.append(f"endpoint {endpoint} is not the Service's /metrics")
    if labels.get(monitor.get("jobLabel", "")) != "fencegate":
        problems.append('the ServiceMonitor does not label its job "fencegate" (the rules\' job)')
    if problems:
        raise CheckFailed("; ".join(problems))
    return "PrometheusRule up to date and accepted by promtool; ServiceMonitor matches the Service"


# ---- configuration ----------------------------------------------------------

def env_file(path: Path) -> dict[str, str]:
    out = {}
    for line in path.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            out[key.strip()] = value.strip()
    return out


def load_toml(path: Path, env: dict[str, str]) -> gateway_config.Config:
    saved = dict(os.environ)
    os.environ.update(env)
    try:
        return gateway_config.load(str(path))
    except gateway_config.ConfigError as exc:
        raise CheckFailed(str(exc)) from None
    finally:
        os.environ.clear()
        os.environ.update(saved)


def check_gateway_configs() -> str:
    base_env = {"FENCEGATE_AGENTS_KEYS": "0" * 64, "SMTP_USER": "u", "SMTP_PASSWORD": "p"}
    overlay = KUBERNETES / "overlays" / "example"
    loaded = [
        load_toml(DEPLOY / "compose" / "gateway.toml",
                  env_file(DEPLOY / "compose" / "fencegate.env")),
        load_toml(KUBERNETES / "base" / "gateway.toml", base_env),
        load_toml(overlay / "gateway.toml", env_file(overlay / "secrets.env")),
    ]
    for c in loaded:
        if c.server.host != "0.0.0.0" or c.server.port != 8080:
            raise CheckFailed(f"{c.source}: a container must listen on 0.0.0.0:8080 "
                              "(the image's HEALTHCHECK and the probes use 8080)")
    return f"{len(loaded)} files loaded by gateway.config.load"


# ---- container image -----------------------------------------------------------

def stages(parser: DockerfileParser) -> list[list[dict[str, Any]]]:
    out: list[list[dict[str, Any]]] = []
    for instruction in parser.structure:
        if instruction["instruction"] == "FROM":
            out.append([])
        if out:
            out[-1].append(instruction)
    return out


def instructions(stage: list[dict[str, Any]], name: str) -> list[str]:
    return [str(i["value"]) for i in stage if i["instruction"] == name]


def check_dockerfile() -> str:
    parser = DockerfileParser(str(DEPLOY / "Dockerfile"))
    all_stages = stages(parser)
    if len(all_stages) < 2:
        raise CheckFailed("the Dockerfile is not multi-stage")
    final = all_stages[-1]
    problems = []
    if not re.search(r"slim|alpine|distroless", parser.baseimage or ""):
        problems.append(f"the final base {parser.baseimage} is not a small one")
    users = instructions(final, "USER")
    if not users or users[-1].split(":")[0] in ("0", "root"):
        problems.append("the final stage does not switch to a non-root USER")
    if not any("/healthz" in h for h in instructions(final, "HEALTHCHECK")):
        problems.append("no HEALTHCHECK on /healthz")
    if [json.loads(e) for e in instructions(final, "ENTRYPOINT")] != [["fencegate"]] or \
            [json.loads(c)[:1] for c in instructions(final, "CMD")] != [["serve"]]:
        problems.append("the entry point is not `fencegate serve`")
    if not any("--from=" in c for c in instructions(final, "COPY")):
        problems.append("the final stage does not copy from the build stage")
    for run_line in instructions(final, "RUN"):
        if re.search(r"\b(apt-get|apk|pip|gcc|make|build-essential)\b", run_line):
            problems.append(f"the final stage installs or builds: {run_line}")
    if "FENCEGATE_CONFIG" not in parser.envs:
        problems.append("FENCEGATE_CONFIG is not set")
    ignore = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    if ignore[:1] != ["*"]:
        problems.append(".dockerignore does not start by excluding everything")
    if problems:
        raise CheckFailed("; ".join(problems))
    return (f"{len(all_stages)} stages, final FROM {parser.baseimage}, USER {users[-1]}, "
            "HEALTHCHECK /healthz, ENTRYPOINT fencegate serve")


def check_image_build_steps() -> str:
    """Execute the build stage as a shell would, on this machine: COPY from the
    context that .dockerignore leaves, then its RUN lines, with its absolute
    paths moved under a temporary root."""
    parser = DockerfileParser(str(DEPLOY / "Dockerfile"))
    build = stages(parser)[0]
    context = {line.strip()[1:].rstrip("/")
               for line in (ROOT / ".dockerignore").read_text().splitlines()
               if line.startswith("!")}
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        shims = root / "shims"
        shims.mkdir()
        python = shutil.which("python3") or sys.executable  # not this venv's python
        (shims / "python").symlink_to(python)
        (shims / "pip").write_text(f"#!/bin/sh\nexec {python} -m pip \"$@\"\n")
        (shims / "pip").chmod(0o755)
        workdir = root / "src"
        for ins in build:
            if ins["instruction"] == "WORKDIR":
                workdir = root / ins["value"].lstrip("/")
                workdir.mkdir(parents=True, exist_ok=True)
            elif ins["instruction"] == "COPY":
                *sources, dest = ins["value"].split()
                for source in sources:
                    if source.rstrip("/") not in context:
                        raise CheckFailed(f"COPY {source}: left out by .dockerignore")
                    src, target = ROOT / source, workdir / dest
                    if src.is_dir():
                        shutil.copytree(src, target, dirs_exist_ok=True,
                                        ignore=shutil.ignore_patterns("__pycache__"))
                    else:
                        shutil.copy(src, target)
            elif ins["instruction"] == "RUN":
                command = re.sub(r"(?<![\w.])/(opt|wheels)\b", f"{root}/\\1", ins["value"])
                env = {**os.environ, "PATH": f"{shims}:{os.environ['PATH']}",
                       "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_CACHE_DIR": "1"}
                env.pop("VIRTUAL_ENV", None)
                run("bash", "-euo", "pipefail", "-c", command, cwd=workdir, env=env)
        fencegate = root / "opt" / "fencegate" / "bin" / "fencegate"
        out = run(fencegate, "--help")
        if "serve" not in out or (root / "opt" / "fencegate" / "bin" / "pip").exists():
            raise CheckFailed("the built environment lacks `fencegate serve`, or has pip")
        try:  # what `fencegate mcp` imports, from the mcp extra
            run(root / "opt" / "fencegate" / "bin" / "python", "-c", "import gateway.mcp.server")
        except CheckFailed as e:
            raise CheckFailed(f"the built environment cannot run `fencegate mcp`: {e}") from None
        size = sum(f.stat().st_size for f in (root / "opt").rglob("*") if f.is_file())
    return f"pip wheel + venv + install executed with {python}: /opt/fencegate {size >> 20} MiB"


# ---- compose ---------------------------------------------------------------

def check_compose() -> str:
    compose = DEPLOY / "compose"
    run(tool("docker-compose"), "-f", compose / "compose.yaml", "config", "-q", cwd=compose)
    doc = yaml.safe_load((compose / "compose.yaml").read_text())
    services = doc["services"]
    wanted = {"postgres", "migrate", "gateway", "mailpit", "webhooks", "prometheus", "grafana"}
    if not wanted <= set(services):
        raise CheckFailed(f"missing services: {sorted(wanted - set(services))}")
    if services["gateway"]["command"] != ["serve", "--workers", "2"] or \
            services["migrate"]["command"] != ["migrate"]:
        raise CheckFailed("the gateway must run `serve --workers 2` and migrate `migrate`")
    if services["gateway"]["depends_on"]["migrate"]["condition"] != \
            "service_completed_successfully":
        raise CheckFailed("the gateway does not wait for the migration")
    mounts = 0
    for service in services.values():
        for volume in service.get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("."):
                mounts += 1
                if not (compose / source).exists():
                    raise CheckFailed(f"compose mounts {source}, which does not exist")
    with tempfile.TemporaryDirectory() as tmp:  # as mounted: both in /etc/prometheus
        shutil.copy(compose / "prometheus.yml", tmp)
        shutil.copy(DEPLOY / "prometheus" / "rules.yml", tmp)
        run(tool("promtool"), "check", "config", Path(tmp) / "prometheus.yml")
    return f"docker-compose config; {len(services)} services; {mounts} mounts exist; " \
           "promtool check config"


# ---- systemd -------------------------------------------------------------------

def check_systemd() -> str:
    units = sorted((DEPLOY / "systemd").glob("*.service"))
    with tempfile.TemporaryDirectory() as tmp:
        copies = []
        for unit in units:  # the installed path, pointed at this checkout's venv
            copy = Path(tmp) / unit.name
            copy.write_text(unit.read_text().replace("/opt/fencegate/bin/", f"{BIN}/"))
            copies.append(copy)
        run(tool("systemd-analyze"), "verify", *copies, quiet_ok=True)
        scores = []
        for copy in copies:
            text = run(tool("systemd-analyze"), "security", "--offline=true",
                       "--threshold=20", copy)
            text = text.replace(str(copy), copy.name)
            score = re.search(r"exposure level for \S+: ([\d.]+)", text)
            scores.append(f"{copy.name} {score.group(1) if score else '?'}")
            if "DynamicUser=" not in copy.read_text() or \
                    "ProtectSystem=strict" not in copy.read_text():
                raise CheckFailed(f"{copy.name} lacks DynamicUser or ProtectSystem=strict")
    return "verify clean; exposure " + ", ".join(scores)


# ---- Prometheus rules and Grafana ---------------------------------------------

def alert_names() -> list[str]:
    rules = yaml.safe_load((DEPLOY / "prometheus" / "rules.yml").read_text())
    return [r["alert"] for g in rules["groups"] for r in g["rules"] if "alert" in r]


def check_rules() -> str:
    prom = DEPLOY / "prometheus"
    run(tool("promtool"), "check", "rules", prom / "rules.yml")
    run(tool("promtool"), "test", "rules", prom / "rules.test.yml", cwd=prom)
    tests = yaml.safe_load((prom / "rules.test.yml").read_text())
    tested = {t["alertname"] for case in tests["tests"] for t in case.get("alert_rule_test", [])
              if t.get("exp_alerts")}
    docs = (ROOT / "docs" / "operations.md").read_text()
    problems = []
    for name in alert_names():
        if name not in tested:
            problems.append(f"{name} has no test that makes it fire")
        if not re.search(rf"^#+ {name}$", docs, re.MULTILINE):
            problems.append(f"{name} has no section in docs/operations.md")
    if problems:
        raise CheckFailed("; ".join(problems))
    return f"{len(alert_names())} alerts, each tested firing and documented"


def check_grafana() -> str:
    grafana_build = generator(DEPLOY / "grafana" / "build.py")
    if (DEPLOY / "grafana" / "fencegate.json").read_text() != grafana_build.render():
        raise CheckFailed("grafana/fencegate.json is stale: run deploy/grafana/build.py")
    board = json.loads((DEPLOY / "grafana" / "fencegate.json").read_text())
    titles = [p["title"] for p in board["panels"] if p["type"] != "row"]
    ids = [p["id"] for p in board["panels"]]
    if len(set(ids)) != len(ids):
        raise CheckFailed("panel ids repeat")
    return f"{len(titles)} panels, up to date with build.py"


CHECKS: list[tuple[str, Callable[[], str]]] = [
    ("yamllint", check_yamllint),
    ("prometheus rules", check_rules),
    ("grafana dashboard", check_grafana),
    ("kubernetes-validate", check_kubernetes_validate),
    ("kubernetes essentials", check_kubernetes_essentials),
    ("prometheus operator", check_prometheus_operator),
    ("gateway configs", check_gateway_configs),
    ("dockerfile", check_dockerfile),
    ("image build steps", check_image_build_steps),
    ("compose", check_compose),
    ("systemd", check_systemd),
]


def main() -> int:
    failed: list[str] = []
    for name, check in CHECKS:
        try:
            detail = check()
        except Exception as exc:  # one check's failure must not hide the others'
            print(f"deploy-check static: FAIL {name}: {type(exc).__name__}: {exc}", flush=True)
            failed.append(name)
        else:
            print(f"deploy-check static: ok   {name}: {detail}", flush=True)
    if failed:
        print(f"deploy-check static: {len(failed)} failed: {', '.join(failed)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
