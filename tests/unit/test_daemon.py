"""The Python daemon's preimports (pipeline/executor/daemon.py): optional, and never a
module that reads the environment a worker must read itself."""

import os
import subprocess
import sys
from pathlib import Path

from pipeline.executor.daemon import PREIMPORTS, preimport

ROOT = Path(__file__).resolve().parents[2]


def test_a_missing_module_is_skipped_not_fatal():
    assert preimport(("pipeline_no_such_module", "json", "pipeline.no_such")) == ["json"]


def test_preimports_leave_faults_to_each_worker():
    # pipeline.faults reads PIPELINE_FAULT once, at import: imported in the daemon, the
    # value would be the daemon's, not each worker's. A fresh interpreter, as the daemon is.
    code = ("import sys; from pipeline.executor.daemon import preimport; "
            "done = preimport(); print(len(done), 'pipeline.faults' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert out == [str(len(PREIMPORTS)), "False"]
