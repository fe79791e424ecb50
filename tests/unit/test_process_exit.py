"""A pipeline command's process ends without the interpreter's final garbage collections
(pipeline/process_exit.py): its objects are frozen at exit, after every hook registered
once the command started, whatever the command's outcome."""

from __future__ import annotations

import subprocess
import sys

from tests.helpers import ROOT

DRIVER = """
import atexit, gc, sys
# Registered before the command runs: the last hook to run.
atexit.register(lambda: print("frozen at exit:", gc.get_freeze_count() > 0, flush=True))
from pipeline.cli import main
code = main(["run", "--config", sys.argv[1]])
print("exit code:", code, "frozen before exit:", gc.get_freeze_count() > 0, flush=True)
sys.exit(code)
"""


def test_a_command_freezes_its_objects_at_exit_and_keeps_its_exit_code(tmp_path):
    proc = subprocess.run([sys.executable, "-c", DRIVER, str(tmp_path / "missing.toml")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stdout.splitlines() == ["exit code: 2 frozen before exit: False",
                                        "frozen at exit: True"], proc.stdout
    assert proc.stderr.startswith("error: "), proc.stderr
