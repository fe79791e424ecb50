"""The driver JVM's start and exit off the driver's critical path (spark/driver_jvm.py),
on a real JVM in a process of its own: a transform's pandas is imported in the thread
started while the JVM starts (a built-in run imports none: spark/numpy_converter.py), and
at the process's exit the JVM is let go before the interpreter finalizes: it exits
cleanly (Spark's shutdown hooks ran: its local directories are gone) while the Python
process is still alive."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.spark.driver_jvm import IMPORT_THREAD
from tests.helpers import ROOT, cli_environ, toml_config, unique, write_config

DRIVER = """
import atexit, importlib.abc, json, sys, threading, traceback

importers = []


class Spy(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path, target=None):
        # an import, not start_spark's importlib.util.find_spec (is pandas installed?)
        if name == "pandas" and not any(
                "importlib.util" in f.filename for f in traceback.extract_stack()):
            importers.append(threading.current_thread().name)
        return None


sys.meta_path.insert(0, Spy())
jvm = {}


def after_everything():
    # Registered before start_spark: runs after every exit hook it registers.
    try:
        code = jvm["proc"].wait(timeout=30)
    except Exception:
        code = "still running"
    print(json.dumps({"importers": importers, "jvm_exit": code}), flush=True)


atexit.register(after_everything)
from pipeline.config import load_settings
from pipeline.spark.launch import start_spark

sc = start_spark(load_settings(sys.argv[1]))
jvm["proc"] = sc._gateway.proc
assert sc.parallelize(range(4), 2).map(lambda x: x + 1).sum() == 10
"""


@pytest.mark.parametrize("transform, importers", [
    ("", []), ('transform = "tests.integration.transforms.orders:identity"\n', [IMPORT_THREAD])])
def test_the_jvm_starts_beside_pysparks_imports_and_exits_before_the_interpreter(
        tmp_path, transform, importers):
    name = unique("jvm")
    local = tmp_path / "spark-local"
    local.mkdir()
    # No class archive: a JVM writing one is let go at exit by class_archive.finish_dump.
    doc = toml_config(name, [name], extra_sink=transform).replace(
        'master = "local[2]"\n', 'master = "local[2]"\nclass_archive = false\n'
    ) + f'[spark.conf]\n"spark.local.dir" = "{local}"\n'
    config = write_config(tmp_path / "p.toml", doc)
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    proc = subprocess.run([sys.executable, str(script), str(config)], cwd=ROOT,
                          env=cli_environ(),
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = json.loads(proc.stdout.strip().splitlines()[-1])
    assert seen["importers"] == importers, seen
    # Exited with Python still running (its stdin open until Python's own exit otherwise),
    # cleanly: Spark's shutdown hooks deleted the directories it made.
    assert seen["jvm_exit"] == 0, (seen, proc.stderr[-3000:])
    assert list(Path(local).iterdir()) == []
    assert "py4j" not in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-3000:]
