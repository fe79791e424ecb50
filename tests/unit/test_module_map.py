"""The module map (docs/architecture.md, "Packages"), read off the imports of every module
(function-level ones too): a lower package never imports a higher one. Held here for the
code that runs inside Spark tasks, formats/ and executor/; they also import no SQLAlchemy
and no SparkSession (they receive everything in one picklable task spec)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"

# cli -> commands -> driver -> sinks -> store / spark -> executor -> plan / settings ->
# formats -> errors, highest first (config.py is the settings' facade, submit.py a cli).
MAP = [{"cli", "submit", "__main__"}, {"commands"}, {"driver"}, {"sinks"}, {"store", "spark"},
       {"executor"}, {"plan", "settings", "config"}, {"formats"}, {"errors"}]
# What a package imports beside the map, each for a reason.
BESIDE = {
    # The named fault points fire inside Spark tasks (stage.stage_attempt, the writer).
    "executor": {"faults"},
}
# Third-party modules a package must not import (prefixes of the module or module.name).
NOT_IMPORTED = {
    "formats": ("sqlalchemy", "pyspark", "py4j"),
    # pyspark's TaskContext (the task's own identity) but no SparkSession.
    "executor": ("sqlalchemy", "pyspark.sql", "py4j"),
}


def imports(package: str) -> dict[str, set[str]]:
    """Each module of pipeline/<package>/ -> every module it imports (``from m import n``
    as m.n, so that ``from pipeline import faults`` is pipeline.faults)."""
    found = {}
    for path in sorted((PIPELINE / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}: a relative import"
                names.update(f"{node.module}.{a.name}" for a in node.names)
        found[str(path.relative_to(PIPELINE.parent))] = names
    return found


def allowed(package: str) -> set[str]:
    """The packages ``package`` may import: its own layer's and every lower one's."""
    layer = next(i for i, names in enumerate(MAP) if package in names)
    return set().union(*MAP[layer:]) | BESIDE.get(package, set())


def above_the_map(package: str) -> dict[str, list[str]]:
    ok = allowed(package)
    return {module: sorted(n for n in names if n.startswith("pipeline.")
                           and n.split(".")[1] not in ok)
            for module, names in imports(package).items()
            if any(n.startswith("pipeline.") and n.split(".")[1] not in ok for n in names)}


@pytest.mark.parametrize("package", ["formats", "executor"])
def test_a_package_imports_nothing_above_it_in_the_module_map(package):
    assert above_the_map(package) == {}, (
        f"pipeline/{package}/ may import only {sorted(allowed(package))} of pipeline/")


@pytest.mark.parametrize("package", sorted(NOT_IMPORTED))
def test_code_inside_spark_tasks_imports_no_sqlalchemy_and_no_spark_session(package):
    bad = {module: sorted(n for n in names if n.startswith(NOT_IMPORTED[package]))
           for module, names in imports(package).items()}
    assert {m: n for m, n in bad.items() if n} == {}


def test_the_map_is_read_from_function_level_imports_too():
    # the writer imports the fault points inside its task function
    assert "pipeline.faults" in imports("executor")["pipeline/executor/transform/writer.py"]
    assert "pyspark.TaskContext" in imports("executor")["pipeline/executor/stage.py"]
