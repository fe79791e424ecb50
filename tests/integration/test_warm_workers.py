"""The warm-up job (spark/warm_workers.py) starts the very Python daemon the read tasks then
use, on a real local Spark in a process of its own: Spark keys its daemons by the job's
environment, and a warm-up of another kind (an RDD job) started a second daemon the read
tasks never used (~90 MB more, docs/benchmarks.md). Here the read tasks' job is built as
driver/transform_job.py builds it: a mapInArrow over spark.range with pandas kept out."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT, cli_environ

pytestmark = pytest.mark.slow

DRIVER = """
import json, os
from pathlib import Path

from pipeline.executor.transform.worker_imports import NO_PANDAS
from pipeline.spark.session import get_context
from pipeline.spark.warm_workers import start_python_workers

sc = get_context("local[2]", {}, jvm="transform")
from pyspark.sql import SparkSession

spark = SparkSession.builder.getOrCreate()
jvm = sc._gateway.proc.pid


def daemons():
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes().replace(b"\\0", b" ")
        except OSError:
            continue
        if int(fields[1]) == jvm and b"daemon" in cmdline:
            found.add(int(stat.parent.name))
    return found


def parent(batches):
    import pyarrow as pa

    for _ in batches:
        yield pa.RecordBatch.from_pydict({"ppid": [os.getppid()]})


start_python_workers(spark).join(120)
warmed = daemons()
sc.setLocalProperty(NO_PANDAS, "true")  # as the read tasks' job (transform_job._transformed)
used = {r.ppid for r in spark.range(0, 2, 1, 2).mapInArrow(parent, "ppid long").collect()}
print(json.dumps({"warmed": sorted(warmed), "used": sorted(used), "after": sorted(daemons())}))
"""


def test_the_read_tasks_run_in_workers_of_the_daemon_the_warm_up_started():
    proc = subprocess.run([sys.executable, "-c", DRIVER], cwd=ROOT, env=cli_environ(None),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert len(seen["warmed"]) == 1, seen  # the warm-up started one daemon
    assert seen["used"] == seen["warmed"] == seen["after"], seen  # and no other was needed
