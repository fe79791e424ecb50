"""The second Spark line's pass really runs on that line: scripts/test runs the spark_line
tests again with .venv-spark35; a pass that silently used the default line's pyspark, JVM
or workers would prove nothing about 3.5."""

from __future__ import annotations

import sys

import pyspark
import pytest


def _worker_versions(_):
    import sys

    import pyspark

    yield pyspark.__version__, sys.executable


@pytest.mark.spark_line
def test_driver_jvm_and_python_workers_run_the_spark_line_of_this_pass(spark,
                                                                      spark_line_version):
    assert pyspark.__version__ == spark_line_version
    assert spark.version == spark_line_version  # the JVM's Spark
    workers = set(spark.sparkContext.parallelize(range(2), 2)
                  .mapPartitions(_worker_versions).collect())
    assert workers == {(spark_line_version, sys.executable)}
