"""Keeping pandas out of the transform path's Python workers when no user Python runs there.

pyarrow asks, the first time it converts Python objects (``pa.array`` of a list,
``pa.scalar``), whether pandas is installed, by importing it: ~40 MB of pandas (and the
sqlalchemy it pulls in) in each worker that only reads Kafka or writes COPY lines, four
of them in a 2-core run (docs/benchmarks.md, "Memory of the transform path"). Inside
``without_pandas`` an import of pandas fails, so pyarrow's probe answers "no pandas" and
our code, which never needs it, runs without it.

That answer stays in the worker's pyarrow (it asks again only where it must have pandas,
e.g. ``to_pandas``, and then finds it), and Spark reuses a worker for the next task: a
user's Python UDF run later in one of our workers would see ``pa.array(series)`` treat a
pandas Series as a plain sequence. So the driver turns this on (a job-local property)
only when the transform's optimized plan is made of nodes known to run no Python but ours
(``python_free``): an allow-list, so that a node we do not know (a new Spark's, a Python
data source's) leaves pandas allowed, as does a plan that cannot be read.
"""

from __future__ import annotations

import logging
import sys
from contextlib import contextmanager

log = logging.getLogger(__name__)

# The job-local property the driver sets when workers may keep pandas out.
NO_PANDAS = "pipeline.workers.no_pandas"

# Optimized logical plan nodes (Catalyst's class names) that evaluate no Python: the plain
# relational operators a Spark-SQL-only transform is made of, and the leaves our read and
# a transform's own tables are. Python shows as nodes of its own (BatchEvalPython,
# ArrowEvalPython, MapInPandas, FlatMapGroupsInPandas, a Python RDD's LogicalRDD, a Python
# data source's relation, ...), none of them here, or as an expression inside a plain
# node (a pandas aggregate UDF is a PythonUDAF inside an Aggregate): any expression whose
# class names Python or pandas makes the plan not ours either.
PLAIN_NODES = frozenset({
    "Project", "Filter", "Join", "Aggregate", "Sort", "Union", "Window", "Expand",
    "Generate", "Repartition", "RepartitionByExpression", "RebalancePartitions",
    "Distinct", "Deduplicate", "Intersect", "Except", "GlobalLimit", "LocalLimit", "Offset",
    "Sample", "Range", "LocalRelation", "OneRowRelation", "LogicalRelation",
})
OUR_NODE = "MapInArrow"  # the read tasks' (feed.py), over a Range of task indexes


def _name(node: dict) -> str:
    return str(node.get("class", "")).rsplit(".", 1)[-1]


def _expression_classes(value, out: set[str]) -> set[str]:
    if isinstance(value, dict):
        if "class" in value:
            out.add(_name(value))
        for v in value.values():
            _expression_classes(v, out)
    elif isinstance(value, list):
        for v in value:
            _expression_classes(v, out)
    return out


def python_free(plan: list[dict], ours: int = 1) -> bool:
    """True if a plan (Catalyst's JSON of it: its nodes in pre-order, each with its
    expressions) holds only PLAIN_NODES without Python expressions, and exactly ``ours``
    MapInArrow nodes, each over a Range: our reader's (the writer's is added after this
    check). Anything else, or anything unexpected in the JSON, is False."""
    readers = 0
    for i, node in enumerate(plan):
        name = _name(node)
        fields = {k: v for k, v in node.items() if k not in ("class", "num-children")}
        if name == OUR_NODE:
            readers += 1
            if node.get("num-children") != 1 or _name(plan[i + 1]) != "Range":
                return False
            fields.pop("functionExpr", None)  # our reader's function
        elif name not in PLAIN_NODES:
            return False
        if any(("Python" in c or "Pandas" in c)
               for c in _expression_classes(list(fields.values()), set())):
            return False
    return readers == ours


def runs_only_ours(df, ours: int = 1) -> bool:
    """python_free of a DataFrame's optimized plan (Python UDFs show there as their
    evaluation nodes, e.g. BatchEvalPython). The plan is read through pyspark's private
    ``_jdf``: anything unexpected there answers False (pandas stays allowed)."""
    import json

    try:
        plan = json.loads(df._jdf.queryExecution().optimizedPlan().toJSON())
        return isinstance(plan, list) and python_free(plan, ours)
    except Exception:  # noqa: BLE001 - the safe answer: the workers may import pandas
        log.debug("the transform's plan could not be read: pandas stays allowed",
                  exc_info=True)
        return False


class _NoPandas:
    """A meta path finder that refuses pandas."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is kept out of the pipeline's reader and writer "
                              "workers (executor/transform/worker_imports.py)")
        return None


def allowed() -> bool:
    """The driver allowed this task's worker to keep pandas out (NO_PANDAS)."""
    from pyspark import TaskContext

    ctx = TaskContext.get()
    return ctx is not None and ctx.getLocalProperty(NO_PANDAS) == "true"


@contextmanager
def without_pandas(active: bool):
    """pandas cannot be imported inside when ``active`` (``allowed()`` in a worker) and this
    process has not imported it already."""
    if not active or "pandas" in sys.modules:
        yield
        return
    finder = _NoPandas()
    sys.meta_path.insert(0, finder)
    try:
        yield
    finally:
        sys.meta_path.remove(finder)
