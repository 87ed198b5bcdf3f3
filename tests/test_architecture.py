"""The house's rules, held against the code's imports (docs/architecture.md draws them): a failing test
names the file and the import that broke one."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

pytestmark = pytest.mark.fast

SRC = Path(__file__).parents[1] / "src"
PACKAGE = SRC / "stasis"
# The floors of the daemon, top down: the wiring (app, wiring, server), the faces (HTTP routes, the console, MCP,
# E2B), the rooms (features standing on the core), the lifecycle core. A floor imports only floors below it.
DAEMON = "stasis.daemon"
FLOORS = [f"{DAEMON}.faces", f"{DAEMON}.rooms", f"{DAEMON}.core"]
WIRING = (f"{DAEMON}.app", f"{DAEMON}.wiring", f"{DAEMON}.server")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every stasis module ``path`` imports, at any depth of its code (TYPE_CHECKING ones too)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names if alias.name.startswith("stasis")}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(
                    package.split(".")[: len(package.split(".")) - node.level + 1] + ([base] if base else [])
                )
            if base.startswith("stasis"):
                found.add(base)
                found |= {
                    f"{base}.{alias.name}"
                    for alias in node.names
                    if (SRC / f"{base}.{alias.name}".replace(".", "/")).with_suffix(".py").exists()
                    or (SRC / f"{base}.{alias.name}".replace(".", "/")).is_dir()
                }
    return found


GRAPH = {module_name(p): imports(p) for p in PACKAGE.rglob("*.py")}


def under(prefix: str) -> dict[str, set[str]]:
    return {m: deps for m, deps in GRAPH.items() if m == prefix or m.startswith(prefix + ".")}


def test_nothing_in_the_daemon_imports_a_backends_own_modules() -> None:
    own = ("stasis.backends.gvisor", "stasis.backends.microvm")
    broken = {m: sorted(d for d in deps if d.startswith(own)) for m, deps in under("stasis.daemon").items()}
    assert {m: d for m, d in broken.items() if d} == {}


def floor_of(module: str) -> int | None:
    """0 for the wiring, then 1, 2, 3 down the floors; None outside the daemon."""
    if module.startswith(WIRING) or module == DAEMON:
        return 0
    return next((n + 1 for n, floor in enumerate(FLOORS) if module == floor or module.startswith(floor + ".")), None)


def test_every_daemon_module_stands_on_a_floor() -> None:
    assert sorted(m for m in under(DAEMON) if floor_of(m) is None) == []


def test_a_floor_imports_only_the_floors_below_it() -> None:
    """The core knows nothing of the rooms that stand on it; the rooms nothing of the faces; nothing but the
    wiring imports the wiring."""
    broken = {
        m: sorted(d for d in deps if (f := floor_of(d)) is not None and f < (floor_of(m) or 0))
        for m, deps in under(DAEMON).items()
    }
    assert {m: d for m, d in broken.items() if d} == {}


def test_nothing_outside_the_daemon_imports_its_floors() -> None:
    """Clients reach the daemon over HTTP; the CLI only starts it (``stasis serve``)."""
    broken = {
        m: sorted(d for d in deps if d.startswith(DAEMON + ".") and d != f"{DAEMON}.server")
        for m, deps in GRAPH.items()
        if not m.startswith(DAEMON)
    }
    assert {m: d for m, d in broken.items() if d} == {}


def test_no_import_circle_inside_the_daemon() -> None:
    daemon = under("stasis.daemon")
    edges = {m: {d for d in deps if d in daemon and d != m} for m, deps in daemon.items()}
    seen: dict[str, int] = {}  # 1: on the current path, 2: done

    def visit(node: str, path: list[str]) -> list[str] | None:
        seen[node] = 1
        for nxt in sorted(edges[node]):
            if seen.get(nxt) == 1:
                return [*path, node, nxt]
            if nxt not in seen and (loop := visit(nxt, [*path, node])):
                return loop
        seen[node] = 2
        return None

    for start in sorted(edges):
        if start not in seen:
            assert (loop := visit(start, [])) is None, " -> ".join(loop)


def test_clients_reach_the_daemon_only_over_http() -> None:
    """The SDK, the agent harness and the framework adapters never import the daemon; the CLI only to serve."""
    for package in ("stasis.sdk", "stasis.agent", "stasis.integrations", "stasis.cli"):
        for m, deps in under(package).items():
            daemon = sorted(d for d in deps if d.startswith("stasis.daemon") and d != "stasis.daemon.server")
            assert daemon == [], f"{m} imports {daemon}"


def test_the_guest_agent_is_standard_library_only() -> None:
    from stasis.guest import AGENT_FILES

    for name in AGENT_FILES:
        path = PACKAGE / "guest" / name
        outside = sorted(d for d in imports(path) if not d.startswith("stasis.guest"))
        assert outside == [], f"{name} imports {outside}"


def test_the_backend_protocol_is_the_operations_every_backend_must_have() -> None:
    from stasis.backends.base import Backend

    methods = sorted(n for n, v in vars(Backend).items() if callable(v) and not n.startswith("_"))
    assert len(methods) <= 14, methods


MAX_MODULE_LINES, MAX_FUNCTION_LINES, MAX_README_LINES = 450, 80, 250


def test_no_hand_written_module_or_function_outgrows_its_room() -> None:
    """Split by responsibility long before this: a size no test holds regrows within a day."""
    too_big = []
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if (lines := text.count("\n")) > MAX_MODULE_LINES:
            too_big.append(f"{path.relative_to(SRC)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_big.append(f"{path.relative_to(SRC)}:{node.lineno} {node.name}(): {length} lines")
    assert too_big == []


def test_the_readme_is_a_front_door_not_a_manual() -> None:
    lines = (SRC.parent / "README.md").read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move the manual's parts to docs/"
