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
only when the transform's plan runs no Python but ours (``python_free``).
"""

from __future__ import annotations

import re
import sys
from contextlib import contextmanager

# The job-local property the driver sets when workers may keep pandas out.
NO_PANDAS = "pipeline.workers.no_pandas"

# Plan nodes whose evaluation runs Python or whose input came from Python (a Python RDD):
# mapInPandas/applyInPandas, Python and pandas UDFs, mapInArrow, a DataFrame of an RDD.
_PYTHON = re.compile(r"Python|Pandas|Arrow|RDD")


def python_free(plan: str, ours: int = 1) -> bool:
    """True if the optimized plan (its text) evaluates no Python beyond our own ``ours``
    mapInArrow nodes (the reader's; the writer's is added after this check). A column
    named like one of the nodes only makes this answer False: the safe side."""
    return _PYTHON.findall(plan) == ["Arrow"] * ours


def runs_only_ours(df, ours: int = 1) -> bool:
    """python_free of a DataFrame's optimized plan (Python UDFs show there as their
    evaluation nodes, e.g. BatchEvalPython)."""
    return python_free(df._jdf.queryExecution().optimizedPlan().toString(), ours)


class _NoPandas:
    """A meta path finder that refuses pandas."""

    def find_spec(self, name, path=None, target=None):
        if name == "pandas" or name.startswith("pandas."):
            raise ImportError("pandas is kept out of the pipeline's reader and writer "
                              "workers (executor/worker_imports.py)")
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
