"""The house's rules, held against the code's imports (docs/architecture.md draws them): a failing test
names the file and the import that broke one."""

from __future__ import annotations

import ast
import re
import shutil
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


def module_name(path: Path, src: Path = SRC) -> str:
    parts = list(path.relative_to(src).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, src: Path = SRC) -> set[str]:
    """Every stasis module ``path`` imports, at any depth of its code (TYPE_CHECKING ones too)."""
    name = module_name(path, src)
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
                    if (src / f"{base}.{alias.name}".replace(".", "/")).with_suffix(".py").exists()
                    or (src / f"{base}.{alias.name}".replace(".", "/")).is_dir()
                }
    return found


def graph(src: Path) -> dict[str, set[str]]:
    return {module_name(p, src): imports(p, src) for p in (src / "stasis").rglob("*.py")}


GRAPH = graph(SRC)


def under(prefix: str, of: dict[str, set[str]] | None = None) -> dict[str, set[str]]:
    return {m: deps for m, deps in (GRAPH if of is None else of).items() if m == prefix or m.startswith(prefix + ".")}


def backend_imports(of: dict[str, set[str]]) -> dict[str, list[str]]:
    own = ("stasis.backends.gvisor", "stasis.backends.microvm")
    broken = {m: sorted(d for d in deps if d.startswith(own)) for m, deps in under(DAEMON, of).items()}
    return {m: d for m, d in broken.items() if d}


def test_nothing_in_the_daemon_imports_a_backends_own_modules() -> None:
    assert backend_imports(GRAPH) == {}


def floor_of(module: str) -> int | None:
    """0 for the wiring, then 1, 2, 3 down the floors; None outside the daemon."""
    if module.startswith(WIRING) or module == DAEMON:
        return 0
    return next((n + 1 for n, floor in enumerate(FLOORS) if module == floor or module.startswith(floor + ".")), None)


def test_every_daemon_module_stands_on_a_floor() -> None:
    assert sorted(m for m in under(DAEMON) if floor_of(m) is None) == []


def upward_imports(of: dict[str, set[str]]) -> dict[str, list[str]]:
    broken = {
        m: sorted(d for d in deps if (f := floor_of(d)) is not None and f < (floor_of(m) or 0))
        for m, deps in under(DAEMON, of).items()
    }
    return {m: d for m, d in broken.items() if d}


def test_a_floor_imports_only_the_floors_below_it() -> None:
    """The core knows nothing of the rooms that stand on it; the rooms nothing of the faces; nothing but the
    wiring imports the wiring."""
    assert upward_imports(GRAPH) == {}


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
    for package in ("stasis.sdk", "stasis.agent", "stasis.integrations", "stasis.cli", "stasis.fleet"):
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


def oversized(src: Path) -> list[str]:
    too_big = []
    for path in (src / "stasis").rglob("*.py"):
        text = path.read_text()
        if (lines := text.count("\n")) > MAX_MODULE_LINES:
            too_big.append(f"{path.relative_to(src)}: {lines} lines")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_big.append(f"{path.relative_to(src)}:{node.lineno} {node.name}(): {length} lines")
    return too_big


def test_no_hand_written_module_or_function_outgrows_its_room() -> None:
    """Split by responsibility long before this: a size no test holds regrows within a day."""
    assert oversized(SRC) == []


def test_the_readme_is_a_front_door_not_a_manual() -> None:
    lines = (SRC.parent / "README.md").read_text().count("\n")
    assert lines <= MAX_README_LINES, f"README.md has {lines} lines: move the manual's parts to docs/"


# ---------------------------------------------------------------- one writer per table

# Each table of the daemon's SQLite file and the one module (or, for the sandbox rows, the one floor) that may
# write it. Which method writes which table is read from the SQL in core/store.py and core/tables.py.
TABLE_OWNERS = {
    "sandboxes": f"{DAEMON}.core",
    "transitions": f"{DAEMON}.core",
    "events": f"{DAEMON}.core",
    "checkpoints": f"{DAEMON}.rooms.checkpointing",
    "pools": f"{DAEMON}.rooms.pools",
    "ports": f"{DAEMON}.rooms.ports",
    "pushes": f"{DAEMON}.rooms.remote",
    "teams": f"{DAEMON}.rooms.teams",
    "team_keys": f"{DAEMON}.rooms.teams",
    "webhooks": f"{DAEMON}.rooms.webhooks",
    "webhook_deliveries": f"{DAEMON}.rooms.webhooks",
    "webhook_attempts": f"{DAEMON}.rooms.webhooks",
}
TABLE_MODULES = (f"{DAEMON}.core.store", f"{DAEMON}.core.tables")
WRITE = re.compile(r"\b(?:INSERT(?: OR REPLACE)? INTO|UPDATE|DELETE FROM)\s+(\w+)", re.IGNORECASE)


def writing_methods(src: Path) -> dict[str, set[str]]:
    """Each method of the table classes that writes, and the tables it writes (its SQL, and the writing
    methods of its own class it calls)."""
    found: dict[str, set[str]] = {}
    for module in TABLE_MODULES:
        tree = ast.parse((src / module.replace(".", "/")).with_suffix(".py").read_text())
        for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
            methods = [n for n in cls.body if isinstance(n, ast.FunctionDef)]
            calls = {m.name: {c.func.attr for c in ast.walk(m) if isinstance(c, ast.Call)
                              and isinstance(c.func, ast.Attribute)} for m in methods}  # fmt: skip
            for method in methods:
                sql = " ".join(
                    c.value for c in ast.walk(method) if isinstance(c, ast.Constant) and isinstance(c.value, str)
                )
                if tables := set(WRITE.findall(sql)):
                    found.setdefault(method.name, set()).update(tables)
            for _ in range(3):  # a method that calls a writing one writes what it writes
                for method in methods:
                    for called in calls[method.name] & set(found):
                        found.setdefault(method.name, set()).update(found[called])
    return {name: tables for name, tables in found.items() if not name.startswith("_")}  # what others may call


def table_writes(src: Path) -> dict[str, list[str]]:
    """Every call of a writing method outside the table's owner: module -> 'method (table)'."""
    writes = writing_methods(src)
    broken: dict[str, list[str]] = {}
    for path in (src / "stasis" / "daemon").rglob("*.py"):
        module = module_name(path, src)
        if module in TABLE_MODULES:
            continue
        for call in ast.walk(ast.parse(path.read_text())):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in writes:
                for table in sorted(writes[call.func.attr]):
                    owner = TABLE_OWNERS[table]
                    if not (module == owner or module.startswith(owner + ".")):
                        broken.setdefault(module, []).append(f"{call.func.attr} ({table})")
    return broken


def test_each_table_has_one_writer() -> None:
    """The core alone writes sandbox rows and their journal; each room's table is written by that room alone:
    every other module gets verbs (``core.claim``, ``checkpoints.adopt``), never the table."""
    writes = writing_methods(SRC)
    assert set().union(*writes.values()) == set(TABLE_OWNERS)  # every table is written somewhere, and owned
    assert {"transition", "insert_checkpoint", "save_pool", "save_port", "begin_push"} <= set(writes)
    assert table_writes(SRC) == {}
    # no other class's method shares a writing method's name (the check reads names, not types)
    verbs = {
        node.name
        for path in (SRC / "stasis" / "daemon").rglob("*.py")
        if module_name(path) not in TABLE_MODULES
        for cls in ast.walk(ast.parse(path.read_text()))
        if isinstance(cls, ast.ClassDef)
        for node in cls.body
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    }
    assert verbs & set(writes) == set()


CORE_INSIDES = {"store", "tables", "boxes", "network", "watchdog"}  # the core's own parts, never a room's to touch


def core_insides(src: Path) -> dict[str, list[str]]:
    """Rooms and faces that reach into the core's parts (``core.store``, ``service.network``) instead of its verbs."""
    broken: dict[str, list[str]] = {}
    for path in (src / "stasis" / "daemon").rglob("*.py"):
        module = module_name(path, src)
        if floor_of(module) not in (1, 2):  # the faces and the rooms; the wiring hands out the tables
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in CORE_INSIDES:
                holder = node.value
                name = holder.attr if isinstance(holder, ast.Attribute) else getattr(holder, "id", "")
                if name in ("core", "service"):
                    broken.setdefault(module, []).append(f"{name}.{node.attr}")
    return broken


def test_rooms_and_faces_use_the_cores_verbs_not_its_parts() -> None:
    assert core_insides(SRC) == {}


# ---------------------------------------------------------------- the rules catch what they are for

PLANTED_ROOM = """
from ..core.service import SandboxService
from ...backends.gvisor.backend import GvisorBackend


async def sneak(core: SandboxService, ports) -> None:
    core.store.transition("sb-1", "failed")
    ports.save_port("sb-1", 80, True, 8080)
"""


def test_each_rule_fails_on_a_planted_violation(tmp_path: Path) -> None:
    """A copy of the tree with one violation of each rule planted: each check names it, and only it."""
    src = tmp_path / "src"
    shutil.copytree(PACKAGE, src / "stasis", ignore=shutil.ignore_patterns("__pycache__", "static"))
    daemon = src / "stasis" / "daemon"
    (daemon / "rooms" / "planted.py").write_text(PLANTED_ROOM)
    (daemon / "core" / "upward.py").write_text("from ..rooms.ports import Ports\n")
    (src / "stasis" / "long.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    body = "".join(f"    y = {n}\n" for n in range(MAX_FUNCTION_LINES))
    (src / "stasis" / "long_function.py").write_text(f"def f() -> None:\n{body}")

    assert table_writes(src) == {
        f"{DAEMON}.rooms.planted": [
            "transition (events)",
            "transition (sandboxes)",
            "transition (transitions)",
            "save_port (ports)",
        ]
    }
    assert core_insides(src) == {f"{DAEMON}.rooms.planted": ["core.store"]}
    assert sorted(oversized(src)) == ["stasis/long.py: 451 lines", "stasis/long_function.py:1 f(): 81 lines"]
    planted = graph(src)
    assert upward_imports(planted) == {f"{DAEMON}.core.upward": [f"{DAEMON}.rooms.ports"]}
    assert list(backend_imports(planted)) == [f"{DAEMON}.rooms.planted"]
