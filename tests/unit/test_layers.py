"""The module map (docs/architecture.md, "Packages"): cli -> commands -> driver -> sinks ->
store / spark -> executor -> plan / settings -> formats -> errors. A package imports only
packages below it, never one beside or above it; and no two modules of a package import
each other, however indirectly (a function-level import is an import too).

Read from the source (every import statement, wherever it is): nothing is imported."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"

# Each package's layer: a package imports only lower layers. config.py is the settings'
# front door; faults, logs, errors and processes are leaves every layer may use.
LAYERS = {
    "cli": 9, "__main__": 9, "submit": 9,
    "commands": 8,
    "driver": 7,
    "sinks": 6,
    "store": 5, "spark": 5,
    "executor": 4,
    "plan": 3, "settings": 3, "config": 3, "logs": 3,
    "formats": 2,
    "errors": 1, "faults": 1, "processes": 1,
}
SAME_PACKAGE = {"config": "settings"}  # the front door and what it re-exports
# The packages this test holds to the map (each one that keeps it).
HELD = ("store", "sinks", "settings", "config", "executor", "formats")


def module_name(path: Path) -> str:
    parts = path.relative_to(PIPELINE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: dict[str, Path]) -> set[str]:
    """Every pipeline module (or package) ``path`` imports: ``from p import m`` of a module
    ``m`` imports p.m, of any other name the module p."""
    found: set[str] = set()
    here = module_name(path).split(".")
    if path.name != "__init__.py":
        here = here[:-1]  # the package a relative import starts from
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                base = ".".join(here[:len(here) - node.level + 1] + ([base] if base else []))
            found.update(f"{base}.{a.name}" if f"{base}.{a.name}" in known else base
                         for a in node.names)
    return {m for m in found if m == "pipeline" or m.startswith("pipeline.")}


def package_of(module: str) -> str:
    parts = module.split(".")
    name = parts[1] if len(parts) > 1 else "pipeline"
    return SAME_PACKAGE.get(name, name)


def modules() -> dict[str, Path]:
    return {module_name(p): p for p in sorted(PIPELINE.rglob("*.py"))}


def upward(held: tuple[str, ...] = HELD) -> list[str]:
    """``module -> imported`` of every import of a held package that is not below it."""
    out = []
    known = modules()
    for name, path in known.items():
        mine = package_of(name)
        if mine not in held:
            continue
        for target in sorted(imports(path, known)):
            theirs = package_of(target)
            if theirs == "pipeline" or theirs == mine:
                continue
            if theirs not in LAYERS:
                out.append(f"{name} -> {target} (a package the map does not place)")
            elif LAYERS[theirs] >= LAYERS[mine]:
                out.append(f"{name} -> {target}")
    return out


def cycles(package: str) -> list[list[str]]:
    """Circles of imports between the modules of ``package``."""
    known = modules()
    graph = {name: sorted(t for t in imports(path, known) if t in known and t != name
                          and package_of(t) == package)
             for name, path in known.items() if package_of(name) == package}
    found, state = [], {}

    def visit(node: str, trail: list[str]) -> None:
        state[node] = "open"
        for nxt in graph.get(node, []):
            if state.get(nxt) == "open":
                found.append(trail[trail.index(nxt):] + [nxt])
            elif nxt not in state:
                visit(nxt, trail + [nxt])
        state[node] = "done"

    for start in graph:
        if start not in state:
            visit(start, [start])
    return found


def test_held_packages_import_only_lower_layers():
    assert upward() == []


@pytest.mark.parametrize("package", ["store", "settings", "sinks", "executor", "formats"])
def test_no_two_modules_of_a_package_import_each_other(package):
    assert cycles(package) == []


def test_the_store_imports_neither_sinks_nor_driver():
    # The map's arrow that matters most: the caller passes the Sink; the engine is the store's.
    bad = [line for line in upward(("store",))
           if " -> pipeline.sinks" in line or " -> pipeline.driver" in line]
    assert bad == []


def test_the_record_formats_import_nothing_of_the_executors():
    # formats/ runs inside the executors' tasks but below them: a task's failure is
    # errors.TaskError, the staging contract executor/staging.py (formats/ once imported
    # executor/task_errors.py).
    bad = [line for line in upward(("formats",)) if " -> pipeline.executor" in line]
    assert bad == []


def test_an_upward_import_is_found(tmp_path, monkeypatch):
    # The check itself can fail: a store module that imports the driver is named.
    fake = tmp_path / "pipeline"
    (fake / "store").mkdir(parents=True)
    (fake / "store" / "bad.py").write_text("def f():\n    from pipeline.driver import job\n")
    (fake / "settings").mkdir()
    (fake / "settings" / "a.py").write_text("from pipeline.settings.b import x\n")
    (fake / "settings" / "b.py").write_text("def g():\n    from pipeline.settings import a\n")
    monkeypatch.setattr(sys.modules[__name__], "PIPELINE", fake)
    assert upward() == ["pipeline.store.bad -> pipeline.driver"]
    assert cycles("settings") == [["pipeline.settings.a", "pipeline.settings.b",
                                   "pipeline.settings.a"]]
