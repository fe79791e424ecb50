"""The transform path's workers keep pandas out when only our code runs there
(executor/worker_imports.py): pyarrow's first conversion of Python objects imports pandas
(~40 MB a worker, docs/benchmarks.md "Memory of the transform path")."""

from __future__ import annotations

import json
import subprocess
import sys

from pipeline.executor.worker_imports import python_free

# What a worker does with pyarrow (the reader's typed rows, the writer's COPY lines), then
# what a later task in the same worker may need of pandas.
_WORKER = """
import json, sys
import pyarrow as pa, pyarrow.compute as pc
from pipeline.executor.worker_imports import without_pandas
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


PLAN_OURS = """Project [topic#3, partition#4, offset#5L, order_id#7L]
+- MapInArrow feed(id#0L)#2, [topic#3, partition#4, offset#5L, order_id#7L], false
   +- Range (0, 2, step=1, splits=Some(2))"""


def test_a_plan_with_only_our_reader_is_python_free():
    assert python_free(PLAN_OURS)


def test_a_plan_with_user_python_is_not():
    udf = "Project [pythonUDF0#9L AS f(order_id)#8L]\n+- BatchEvalPython [f(order_id#7L)#6L]\n"
    assert not python_free(udf + PLAN_OURS)
    assert not python_free("MapInPandas f(x#1)#2, [x#3], false\n+- " + PLAN_OURS)
    assert not python_free("MapInArrow g(x#1)#2, [x#3], false\n+- " + PLAN_OURS)
    assert not python_free("Union\n:- LogicalRDD [id#7L], false\n+- " + PLAN_OURS)
    assert not python_free("LogicalRDD [id#7L], false")
    assert not python_free("FlatMapGroupsInPandas [id#2L], f(id#2L)#8\n+- " + PLAN_OURS)
