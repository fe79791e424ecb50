"""A driver that starts Spark imports no pandas, grpc or pyspark's test helpers (pyspark's
numpy converters would, on the JVM's first call: ~0.5 s, ~50-80 MB; spark/numpy_converter.py),
and numpy values still cross to the real JVM as pyspark converts them."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers import ROOT, cli_environ

pytestmark = pytest.mark.slow

DRIVER = """
import json, sys
from pipeline.spark.session import get_context
sc = get_context("local[1]", {})
loaded = sorted(m for m in ("pandas", "grpc", "pyspark.testing") if m in sys.modules)
import numpy as np
array = sc._jvm.java.util.Arrays.toString(np.array([4, 5], dtype="int32"))
scalar = sc._jvm.java.lang.Math.abs(np.int64(-3))
print(json.dumps({"loaded": loaded, "array": array, "scalar": scalar}))
"""


def test_starting_spark_imports_no_pandas_and_numpy_values_still_convert():
    proc = subprocess.run([sys.executable, "-c", DRIVER], cwd=ROOT, env=cli_environ(None),
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    assert got == {"loaded": [], "array": "[4, 5]", "scalar": 3}, got
