"""The app's modules import each other in layers, with no circle anywhere: ``scheduling`` (the order
model's bridge to the queue) uses the kinds of ``timers``; nothing ``timers`` imports, at any
depth, imports it back; ``notices`` (the rows a shop writes and the handlers it declares) sits
below ``timers``, which runs them; and no two modules of the app, nor of the benchmark, import
each other, at any depth.

Read from the source (every ``import``, at module level, in a function or under
``TYPE_CHECKING``), not from what happens to be loaded: a circle hidden in a function is
still a circle a reader has to follow.
"""

from __future__ import annotations

import ast
from pathlib import Path

import order_timeout

from .conftest import PROJECT_ROOT

PACKAGE = Path(order_timeout.__file__).parent
BENCH = PROJECT_ROOT / "bench"


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, package: Path = PACKAGE) -> set[str]:
    """The modules of ``package`` that ``path`` imports (a name imported from a package counts
    as its module when there is one)."""
    here = module_name(path, package)
    package_name = here if path.name == "__init__.py" else here.rsplit(".", 1)[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package_name.split(".")
                anchor = anchor[:len(anchor) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            found.add(base)
            found |= {f"{base}.{alias.name}" for alias in node.names}
    return {name for name in found if name == package.name or name.startswith(package.name + ".")}


def graph(package: Path = PACKAGE) -> dict[str, set[str]]:
    modules = {module_name(path, package): path for path in package.rglob("*.py") if "migrations" not in path.parts}
    return {name: imports_of(path, package) & set(modules) for name, path in modules.items()}


def reachable(edges: dict[str, set[str]], start: str) -> dict[str, str]:
    """Every module reachable from ``start``, each with the module it was first reached from."""
    seen: dict[str, str] = {}
    todo = [start]
    while todo:
        current = todo.pop()
        for target in sorted(edges.get(current, ())):
            if target not in seen:
                seen[target] = current
                todo.append(target)
    return seen


def test_nothing_the_timers_import_imports_scheduling_back() -> None:
    edges = graph()
    timers = [name for name in edges if name.startswith("order_timeout.timers")]
    circles = []
    for name in timers:
        came_from = reachable(edges, name)
        if "order_timeout.scheduling" in came_from:
            path, step = ["order_timeout.scheduling"], "order_timeout.scheduling"
            while step != name:
                step = came_from[step]
                path.append(step)
            circles.append(" -> ".join(reversed(path)))
    assert timers and not circles, "\n".join(circles)


def test_the_notices_never_reach_up_into_the_timers_that_run_them() -> None:
    edges = graph()
    notices = [name for name in edges if name.startswith("order_timeout.notices")]
    upward = [f"{name} -> {target}" for name in notices for target in sorted(edges[name])
              if target.startswith("order_timeout.timers")]
    assert notices and upward == [], "\n".join(upward)


def test_scheduling_uses_the_timers() -> None:
    # The layer this file guards: were it to stop importing them, the test above would guard nothing.
    assert {"order_timeout.timers.syncing", "order_timeout.timers.registry"} <= graph()["order_timeout.scheduling"]


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Every set of modules that import each other in a loop (Tarjan's strongly connected
    components of more than one module, or one that imports itself)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(name: str) -> None:
        index[name] = low[name] = len(index)
        stack.append(name)
        for target in sorted(edges.get(name, ())):
            if target not in index:
                visit(target)
                low[name] = min(low[name], low[target])
            elif target in stack:
                low[name] = min(low[name], index[target])
        if low[name] == index[name]:
            component = [stack.pop()]
            while component[-1] != name:
                component.append(stack.pop())
            if len(component) > 1 or name in edges.get(name, ()):
                found.append(sorted(component))

    for name in sorted(edges):
        if name not in index:
            visit(name)
    return found


def test_no_module_of_the_app_imports_another_that_imports_it_back() -> None:
    """A lower module never needs a higher one: what both need moves down, or is passed in."""
    assert circles(graph()) == []


def test_no_module_of_the_benchmark_imports_another_that_imports_it_back() -> None:
    edges = graph(BENCH)
    assert "bench.systems" in edges and circles(edges) == []


def test_the_circle_finder_finds_a_circle() -> None:
    # The test above would pass on a finder that finds nothing.
    edges = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"e"}}
    assert circles(edges) == [["a", "b", "c"], ["e"]]
