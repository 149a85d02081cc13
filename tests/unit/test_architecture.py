"""The import graph docs/ARCHITECTURE.md draws: leases never imports
gateway, the client needs none of the server, dev tooling stays apart, and
no module imports another that imports it back."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("leases", "gateway")


def _module(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _imports() -> dict[str, set[str]]:
    """module → the fencegate modules it imports, at run time (not under
    TYPE_CHECKING)."""
    graph: dict[str, set[str]] = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            name = _module(path)
            is_package = path.name == "__init__.py"
            tree = ast.parse(path.read_text())
            found: set[str] = set()
            for node in ast.walk(tree):
                if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                    node.body = []
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    found |= {a.name for a in node.names}
                elif isinstance(node, ast.ImportFrom):
                    if node.level:
                        base = name.split(".")
                        base = base[:len(base) - node.level + (1 if is_package else 0)]
                        prefix = ".".join(base + ([node.module] if node.module else []))
                    else:
                        prefix = node.module or ""
                    found.add(prefix)
                    found |= {f"{prefix}.{a.name}" for a in node.names}
            graph[name] = {m for m in found if m.split(".")[0] in PACKAGES}
    modules = set(graph)
    return {m: {i for i in deps if i in modules and i != m} for m, deps in graph.items()}


def test_leases_never_imports_gateway() -> None:
    for module, deps in _imports().items():
        if module.startswith("leases"):
            assert not [d for d in deps if d.startswith("gateway")], module


def test_the_client_needs_nothing_of_the_server() -> None:
    deps = _imports()["gateway.client"]
    assert deps <= {"gateway", "gateway.wire"}, deps


def test_the_receiver_needs_nothing_of_the_server() -> None:
    """A webhook receiver installs fencegate for gateway.receiver alone."""
    allowed = {"gateway", "gateway.signing", "gateway.wire", "leases", "leases.column_fence"}
    for module, deps in _imports().items():
        if module.startswith("gateway.receiver") or module == "gateway.signing":
            assert {d for d in deps if not d.startswith("gateway.receiver")} <= allowed, module


def test_dev_tooling_stays_apart() -> None:
    for module, deps in _imports().items():
        if not module.startswith("gateway.dev") and module != "gateway.cli":
            assert not [d for d in deps if d.startswith("gateway.dev")], module
    for path in list((ROOT / "gateway").rglob("*.py")) + list((ROOT / "leases").rglob("*.py")):
        if "dev" not in path.relative_to(ROOT).parts:
            assert "aiosmtpd" not in path.read_text(), path


def test_the_import_graph_has_no_cycles() -> None:
    graph = _imports()
    done: set[str] = set()

    def visit(module: str, path: list[str]) -> None:
        if module in path:
            cycle = [*path[path.index(module):], module]
            raise AssertionError(f"import cycle: {' -> '.join(cycle)}")
        if module in done:
            return
        for dep in sorted(graph.get(module, ())):
            # a package's own __init__ is where its names come from, not a cycle
            if module.startswith(dep + "."):
                continue
            visit(dep, [*path, module])
        done.add(module)

    for module in sorted(graph):
        visit(module, [])


def test_the_agents_tools_need_nothing_of_the_server() -> None:
    allowed = {"gateway", "gateway.client", "gateway.wire", "gateway.errors", "leases",
               "leases.policy", "leases.clock"}
    for module, deps in _imports().items():
        if module.startswith("gateway.mcp"):
            outside = {d for d in deps if not d.startswith("gateway.mcp")} - allowed
            assert not outside, (module, outside)


def test_only_the_mcp_server_imports_the_mcp_sdk() -> None:
    for path in (ROOT / "gateway").rglob("*.py"):
        tree = ast.parse(path.read_text())
        names = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
        names |= {n.module or "" for n in ast.walk(tree)
                  if isinstance(n, ast.ImportFrom) and not n.level}
        if any(m == "mcp" or m.startswith(("mcp.", "mcp_types")) for m in names):
            assert path.name in ("server.py", "serve.py") and path.parent.name == "mcp", path
