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


# A C library's exit handler that crashes (as two OpenSSL copies' cleanups did: SIGSEGV after
# the error line), registered with libc's atexit before the command runs.
CRASHING_C_EXIT = """
import ctypes, sys
libc = ctypes.CDLL(None)
libc.__cxa_atexit.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
libc.__cxa_atexit(ctypes.cast(libc.abort, ctypes.c_void_p), None, None)
sys.argv = ["pipeline", "run", "--config", sys.argv[1]]
from pipeline.{module} import {entry}
{entry}()
"""


def test_the_command_keeps_its_exit_code_when_a_c_library_crashes_at_exit(tmp_path):
    missing = str(tmp_path / "missing.toml")
    plain = subprocess.run(
        [sys.executable, "-c", CRASHING_C_EXIT.format(module="cli", entry="main")
         .replace("main()", "sys.exit(main())"), missing],
        cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert plain.returncode == -6, plain.stderr[-2000:]  # the crash the test stands for

    for module, entry in (("cli", "run"), ("__main__", "run")):
        code = CRASHING_C_EXIT.format(module=module, entry=entry)
        if module == "__main__":
            code = code.replace("from pipeline.__main__ import run\nrun()",
                                "import runpy; runpy.run_module('pipeline', run_name='__main__')")
        proc = subprocess.run([sys.executable, "-c", code, missing], cwd=ROOT,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, (module, proc.returncode, proc.stderr[-2000:])
        assert proc.stderr.startswith("error: "), proc.stderr
