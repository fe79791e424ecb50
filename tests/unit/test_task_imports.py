"""The code that runs inside Spark tasks, formats/ and executor/, imports no SQLAlchemy and
no SparkSession (they receive everything in one picklable task spec; docs/architecture.md,
"Rules the layout keeps"): read off every import statement, function-level ones too. Their
place in the module map is test_layers.py's."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PIPELINE = Path(__file__).resolve().parents[2] / "pipeline"

# Third-party modules a package must not import (prefixes of the module or module.name).
NOT_IMPORTED = {
    "formats": ("sqlalchemy", "pyspark", "py4j"),
    # pyspark's TaskContext (the task's own identity) but no SparkSession.
    "executor": ("sqlalchemy", "pyspark.sql", "py4j"),
}


def imports(package: str) -> dict[str, set[str]]:
    """Each module of pipeline/<package>/ -> every module it imports (``from m import n``
    as m.n, so that ``from pyspark import TaskContext`` is pyspark.TaskContext)."""
    found = {}
    for path in sorted((PIPELINE / package).rglob("*.py")):
        names: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                names.update(f"{node.module}.{a.name}" for a in node.names)
        found[str(path.relative_to(PIPELINE.parent))] = names
    return found


@pytest.mark.parametrize("package", sorted(NOT_IMPORTED))
def test_code_inside_spark_tasks_imports_no_sqlalchemy_and_no_spark_session(package):
    bad = {module: sorted(n for n in names if n.startswith(NOT_IMPORTED[package]))
           for module, names in imports(package).items()}
    assert {m: n for m, n in bad.items() if n} == {}


def test_function_level_imports_are_read_too():
    assert "pyspark.TaskContext" in imports("executor")["pipeline/executor/stage.py"]
