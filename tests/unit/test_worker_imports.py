"""The transform path's workers keep pandas out when only our code runs there
(executor/transform/worker_imports.py): pyarrow's first conversion of Python objects imports pandas
(~40 MB a worker, git history of docs/benchmarks.md)."""

from __future__ import annotations

import json
import subprocess
import sys

from pipeline.executor.transform.worker_imports import python_free, runs_only_ours

# What a worker does with pyarrow (the reader's typed rows, the writer's COPY lines), then
# what a later task in the same worker may need of pandas.
_WORKER = """
import json, sys
import pyarrow as pa, pyarrow.compute as pc
from pipeline.executor.transform.worker_imports import without_pandas
with without_pandas({active}):
    pa.array(["a", None], pa.large_string())
    pc.fill_null(pa.array([None], pa.string()), "\\\\N")
    pa.scalar("x")
inside = "pandas" in sys.modules
import pandas as pd
frame = pa.table({{"x": [1.5, None]}}).to_pandas()
back = pa.Table.from_pandas(pd.DataFrame({{"x": [1.5, None]}})).column("x").null_count
print(json.dumps([inside, len(frame), back]))
"""


def _run(active: bool) -> list:
    out = subprocess.run([sys.executable, "-c", _WORKER.format(active=active)],
                         capture_output=True, text=True, check=True)
    return json.loads(out.stdout)


def test_pyarrow_converts_without_importing_pandas_inside_the_guard():
    assert _run(True) == [False, 2, 1]


def test_without_the_guard_pyarrow_imports_pandas():
    # what the guard saves: pyarrow's probe imports pandas on its first conversion
    assert _run(False) == [True, 2, 1]


# Plans as Catalyst's toJSON gives them (Spark 4.0, trimmed to what python_free reads):
# nodes in pre-order, each with its expressions.
def expr(cls: str, *children: dict) -> dict:
    return {"class": f"org.apache.spark.sql.catalyst.expressions.{cls}",
            "num-children": len(children), "children": list(children)}


def node(cls: str, children: int = 1, **fields) -> dict:
    return {"class": f"org.apache.spark.sql.catalyst.plans.logical.{cls}",
            "num-children": children, **fields}


COLUMN = expr("AttributeReference")
READER = [node("MapInArrow", functionExpr=[expr("PythonUDF", COLUMN)], output=[[COLUMN]]),
          node("Range", 0, output=[[COLUMN]])]
OURS = [node("Project", projectList=[[COLUMN]]), *READER]


def test_a_plan_of_our_reader_and_plain_relational_nodes_is_python_free():
    assert python_free(READER) and python_free(OURS)
    # the realistic transform's: a filter, a broadcast join with an inline table
    realistic = [node("Project", projectList=[[expr("Alias", expr("CaseWhen", COLUMN))]]),
                 node("Join", 2, condition=[expr("EqualTo", COLUMN, COLUMN)]),
                 node("Filter", condition=[expr("GreaterThan", COLUMN)]), *READER,
                 node("LocalRelation", 0, output=[[COLUMN]])]
    assert python_free(realistic)
    assert python_free([node("Aggregate", aggregateExpressions=[[expr("Sum", COLUMN)]]),
                        *OURS])


def test_a_plan_with_user_python_or_a_node_we_do_not_know_is_not():
    udf = [node("Project"), node("BatchEvalPython", udfs=[expr("PythonUDF")]), *READER]
    assert not python_free(udf)
    # a pandas aggregate UDF is an expression inside a plain Aggregate node
    pandas_agg = [node("Aggregate", aggregateExpressions=[[expr(
        "aggregate.AggregateExpression", expr("PythonUDAF", COLUMN))]]), *OURS]
    assert not python_free(pandas_agg)
    assert not python_free([node("MapInPandas"), *READER])
    assert not python_free([node("Join", 2), *READER, node("LogicalRDD", 0)])
    assert not python_free([node("SomeNodeOfANewerSpark"), *READER])  # unknown: not ours
    assert not python_free([node("Union", 2), *READER, *READER])  # our reader twice
    assert not python_free([node("MapInArrow"), node("Project"), *READER])  # another's
    assert not python_free([node("Range", 0)])  # no reader at all


class _Plan:
    def toJSON(self):
        return json.dumps(OURS)


class _Frame:
    """A DataFrame as runs_only_ours reads it, or one whose private plan is missing."""

    def __init__(self, plan=True):
        if plan:
            self._jdf = type("J", (), {"queryExecution": lambda s: type(
                "Q", (), {"optimizedPlan": lambda q: _Plan()})()})()


def test_a_plan_that_cannot_be_read_leaves_pandas_allowed():
    assert runs_only_ours(_Frame())
    assert not runs_only_ours(_Frame(plan=False))  # pyspark without _jdf
