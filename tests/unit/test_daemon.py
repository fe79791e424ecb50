"""The Python daemon's preimports (pipeline/executor/daemon.py): optional, and never a
module that reads the environment a worker must read itself."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.executor.daemon import (
    ARROW_ENV,
    ARROW_PREIMPORTS,
    PREIMPORTS,
    REGISTRY_ENV,
    REGISTRY_PREIMPORTS,
    drop_jars,
    prefer_installed,
    preimport,
)

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def no_running_jvm(monkeypatch):
    """spark_conf's SparkConf() reads the spark.* system properties of a JVM this process
    already runs (another test's SparkContext): these tests are about our defaults alone."""
    from pyspark import SparkContext

    monkeypatch.setattr(SparkContext, "_jvm", None)


def test_a_missing_module_is_skipped_not_fatal():
    assert preimport(("pipeline_no_such_module", "json", "pipeline.no_such")) == ["json"]


def test_every_preimport_names_a_module_that_exists():
    # preimport() skips a name it cannot import: a module moved or renamed would silently
    # leave every worker to import it again.
    from importlib.util import find_spec

    missing = [name for name in PREIMPORTS + ARROW_PREIMPORTS + REGISTRY_PREIMPORTS
               if find_spec(name) is None]
    assert missing == []


def test_java_archives_leave_the_import_path_and_its_caches(tmp_path):
    import zipfile
    import zipimport

    jar = str(tmp_path / "spark-core.jar")
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("org/apache/spark/A.class", b"")
    finder = zipimport.zipimporter(jar)  # what an import that missed the zips before made
    path = ["/spark/python/lib/pyspark.zip", jar, "/checkout"]
    cache = {jar: finder, "/checkout": None}
    assert drop_jars(path, cache) == [jar]
    assert path == ["/spark/python/lib/pyspark.zip", "/checkout"]
    assert cache == {"/checkout": None}
    assert jar not in zipimport._zip_directory_cache


def _zip(path, name, files):
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        for relative, text in files.items():
            z.writestr(f"{name}/{relative}", text)
    return str(path)


def _installed(site, name, files):
    for relative, text in files.items():
        (site / name / relative).parent.mkdir(parents=True, exist_ok=True)
        (site / name / relative).write_text(text)


PYSPARK = {"__init__.py": "", "version.py": "__version__: str = '4.0.0'\n",
           "worker.py": "def main(): pass\n", "tests/test_it.py": "def test(): pass\n"}
PY4J = {"__init__.py": "", "version.py": "__version__ = '0.10.9.9'\n"}


def test_spark_zips_of_the_very_same_files_leave_the_path(tmp_path):
    site = tmp_path / "site"
    _installed(site, "pyspark", {k: v for k, v in PYSPARK.items() if "tests" not in k})
    _installed(site, "py4j", PY4J)
    pyspark_zip = _zip(tmp_path / "pyspark.zip", "pyspark", PYSPARK)
    py4j_zip = _zip(tmp_path / "py4j-0.10.9.9-src.zip", "py4j", PY4J)
    path = [pyspark_zip, py4j_zip, "/checkout", str(site)]
    cache = {pyspark_zip: None, "/checkout": None}
    # pip's wheel has no tests packages: the zip's tests are no difference
    assert prefer_installed(path, cache, modules={}) == [pyspark_zip, py4j_zip]
    assert path == ["/checkout", str(site)] and cache == {"/checkout": None}


def test_a_patched_pyspark_of_the_same_version_keeps_its_zip(tmp_path):
    # a vendor's Spark: the same version string, one module changed
    site = tmp_path / "site"
    _installed(site, "pyspark", PYSPARK)
    patched = _zip(tmp_path / "pyspark.zip", "pyspark",
                   {**PYSPARK, "worker.py": "def main(): patched()\n"})
    path = [patched, str(site)]
    assert prefer_installed(path, {}, modules={}) == [] and path == [patched, str(site)]
    # a module the installed copy lacks (not a test) keeps it too
    more = _zip(tmp_path / "more.zip", "pyspark", {**PYSPARK, "extra.py": ""})
    assert prefer_installed([more, str(site)], {}, modules={}) == []


def test_spark_zips_stay_with_none_installed_pyspark_loaded_or_an_unreadable_zip(tmp_path):
    pyspark_zip = _zip(tmp_path / "pyspark.zip", "pyspark", PYSPARK)
    assert prefer_installed([pyspark_zip, str(tmp_path / "empty")], {}, modules={}) == []
    _installed(tmp_path / "same", "pyspark", PYSPARK)
    path = [pyspark_zip, str(tmp_path / "same")]
    assert prefer_installed(list(path), {}, modules={"pyspark": object()}) == []
    broken = tmp_path / "broken.zip"
    broken.write_bytes(b"not a zip")
    assert prefer_installed([str(broken), str(tmp_path / "same")], {}, modules={}) == []


def test_jars_leave_the_path_without_zipimports_private_cache(tmp_path, monkeypatch):
    import zipimport

    monkeypatch.delattr(zipimport, "_zip_directory_cache")
    path, cache = ["/spark/core.jar", "/checkout"], {"/spark/core.jar": None}
    assert drop_jars(path, cache) == ["/spark/core.jar"]
    assert path == ["/checkout"] and cache == {}


def test_a_failing_step_leaves_pysparks_own_daemon_to_run(monkeypatch):
    from pipeline.executor import daemon

    ran = []

    def broken(*args, **kwargs):
        raise AttributeError("a CPython or pyspark without what the step uses")

    for step in ("drop_jars", "prefer_installed", "preimport"):
        monkeypatch.setattr(daemon, step, broken)
    monkeypatch.setattr(daemon, "run_pyspark_daemon", lambda: ran.append(True))
    monkeypatch.setattr(daemon.gc, "freeze", lambda: None)
    daemon.main()
    assert ran == [True]


def test_preimports_leave_faults_to_each_worker():
    # pipeline.faults reads PIPELINE_FAULT once, at import: imported in the daemon, the
    # value would be the daemon's, not each worker's. A fresh interpreter, as the daemon is.
    code = ("import sys; from pipeline.executor.daemon import preimport; "
            "done = preimport(); print(len(done), 'pipeline.faults' in sys.modules)")
    env = {k: v for k, v in os.environ.items() if k not in (ARROW_ENV, REGISTRY_ENV)}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT,
                         env={**env, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert out == [str(len(PREIMPORTS + ARROW_PREIMPORTS)), "False"]


def loaded_after_preimport(variable: str, flag: str | None, *modules: str) -> list[str]:
    """preimport() in a fresh Python with ``variable`` unset or set to ``flag``: whether each
    of ``modules`` is then loaded ("True"/"False")."""
    env = {k: v for k, v in os.environ.items() if k != variable}
    if flag is not None:
        env[variable] = flag
    code = ("import sys; from pipeline.executor.daemon import preimport; preimport(); "
            f"print(*(m in sys.modules for m in {modules!r}))")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True, cwd=ROOT,
                          env={**env, "PYTHONPATH": str(ROOT)}).stdout.split()


@pytest.mark.parametrize("flag, loaded", [(None, False), ("0", False), ("1", True)])
def test_the_registry_client_is_preimported_only_for_a_run_that_reads_with_one(flag, loaded):
    # Every page the daemon holds counts again in each forked worker's RSS: a json run's
    # daemon must not carry the schema registry client (httpx, authlib, fastavro).
    out = loaded_after_preimport(REGISTRY_ENV, flag, "confluent_kafka.schema_registry",
                                 "confluent_kafka")
    assert out == [str(loaded), "True"]


@pytest.mark.parametrize("flag, loaded", [(None, True), ("1", True), ("0", False)])
def test_pyarrow_is_preimported_unless_the_run_reads_no_arrow(flag, loaded):
    # A built-in sink's workers never import pyarrow (~0.2 CPU-s): its daemon, which the
    # first read task waits for, must not either. A session the driver did not configure
    # (no flag) keeps it, as a transform's workers need it.
    out = loaded_after_preimport(ARROW_ENV, flag, "pyarrow", "pipeline.executor.consume")
    assert out == [str(loaded), "True"]


def test_the_driver_tells_the_daemon_whether_the_run_reads_arrow(monkeypatch):
    from pipeline.spark import session

    monkeypatch.setenv("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", sys.executable))
    monkeypatch.setenv(ARROW_ENV, "1")  # an earlier run's value is not kept
    conf = session.spark_conf("local[2]", {}, arrow=False)
    assert os.environ[ARROW_ENV] == "0"
    assert conf.get(f"spark.executorEnv.{ARROW_ENV}") == "0"  # a cluster's daemon
    session.spark_conf("local[2]", {})
    assert os.environ[ARROW_ENV] == "1"


def test_the_driver_tells_the_daemon_whether_the_run_reads_a_registry(monkeypatch):
    from pipeline.spark import session

    monkeypatch.setenv("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", sys.executable))
    monkeypatch.setenv(REGISTRY_ENV, "1")  # an earlier run's value is not kept
    conf = session.spark_conf("local[2]", {})
    assert os.environ[REGISTRY_ENV] == "0"
    assert conf.get(f"spark.executorEnv.{REGISTRY_ENV}") == "0"  # a cluster's daemon
    session.spark_conf("local[2]", {}, schema_registry=True)
    assert os.environ[REGISTRY_ENV] == "1"


def test_our_daemon_is_the_default_on_one_machine_and_opt_in_on_a_cluster(monkeypatch):
    from pipeline.spark import session

    # spark_conf points PYSPARK_PYTHON at spark.pyspark.python: restored after the test
    monkeypatch.setenv("PYSPARK_PYTHON", os.environ.get("PYSPARK_PYTHON", sys.executable))
    key = "spark.python.daemon.module"
    assert session.spark_conf("local[2]", {}).get(key) == "pipeline.executor.daemon"
    # Workers running another interpreter may lack pipeline: pyspark's daemon then.
    assert session.spark_conf("local[2]", {"spark.pyspark.python": "/other/python"}).get(
        key) is None
    # A cluster's executors may get pipeline only per task (--py-files): opt-in there.
    monkeypatch.setattr(session, "check_master_reachable", lambda master: None)
    assert session.spark_conf("spark://127.0.0.1:1", {}).get(key) is None
    mine = {key: "pipeline.executor.daemon", "spark.pyspark.python": "./job/bin/python"}
    assert session.spark_conf("spark://127.0.0.1:1", mine).get(key) == "pipeline.executor.daemon"
