"""The Python daemon's preimports (pipeline/executor/daemon.py): optional, and never a
module that reads the environment a worker must read itself."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

from pipeline.executor.daemon import (
    PREIMPORTS,
    REGISTRY_ENV,
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


def _zip(path, name, version):
    import zipfile

    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}/__init__.py", "")
        z.writestr(f"{name}/version.py", f"__version__: str = '{version}'\n")
    return str(path)


def _installed(site, name, version):
    (site / name).mkdir(parents=True)
    (site / name / "__init__.py").write_text("")
    (site / name / "version.py").write_text(f'__version__ = "{version}"\n')


def test_spark_zips_of_the_installed_versions_leave_the_path(tmp_path):
    site = tmp_path / "site"
    _installed(site, "pyspark", "4.0.0")
    _installed(site, "py4j", "0.10.9.9")
    pyspark_zip = _zip(tmp_path / "pyspark.zip", "pyspark", "4.0.0")
    py4j_zip = _zip(tmp_path / "py4j-0.10.9.9-src.zip", "py4j", "0.10.9.9")
    path = [pyspark_zip, py4j_zip, "/checkout", str(site)]
    cache = {pyspark_zip: None, "/checkout": None}
    assert prefer_installed(path, cache, modules={}) == [pyspark_zip, py4j_zip]
    assert path == ["/checkout", str(site)] and cache == {"/checkout": None}


def test_spark_zips_stay_for_another_version_none_installed_or_pyspark_loaded(tmp_path):
    site = tmp_path / "site"
    _installed(site, "pyspark", "3.5.7")  # a spark-submit of another Spark
    pyspark_zip = _zip(tmp_path / "pyspark.zip", "pyspark", "4.0.0")
    py4j_zip = _zip(tmp_path / "py4j-0.10.9.9-src.zip", "py4j", "0.10.9.9")  # none installed
    path = [pyspark_zip, py4j_zip, str(site)]
    assert prefer_installed(path, {}, modules={}) == []
    assert path == [pyspark_zip, py4j_zip, str(site)]
    _installed(tmp_path / "same", "pyspark", "4.0.0")
    path = [pyspark_zip, str(tmp_path / "same")]
    assert prefer_installed(list(path), {}, modules={"pyspark": object()}) == []


def test_preimports_leave_faults_to_each_worker():
    # pipeline.faults reads PIPELINE_FAULT once, at import: imported in the daemon, the
    # value would be the daemon's, not each worker's. A fresh interpreter, as the daemon is.
    code = ("import sys; from pipeline.executor.daemon import preimport; "
            "done = preimport(); print(len(done), 'pipeline.faults' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert out == [str(len(PREIMPORTS)), "False"]


@pytest.mark.parametrize("flag, loaded", [(None, False), ("0", False), ("1", True)])
def test_the_registry_client_is_preimported_only_for_a_run_that_reads_with_one(flag, loaded):
    # Every page the daemon holds counts again in each forked worker's RSS: a json run's
    # daemon must not carry the schema registry client (httpx, authlib, fastavro).
    env = {k: v for k, v in os.environ.items() if k != REGISTRY_ENV}
    if flag is not None:
        env[REGISTRY_ENV] = flag
    code = ("import sys; from pipeline.executor.daemon import preimport; preimport(); "
            "print('confluent_kafka.schema_registry' in sys.modules, "
            "'confluent_kafka' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, cwd=ROOT,
                         env={**env, "PYTHONPATH": str(ROOT)}).stdout.split()
    assert out == [str(loaded), "True"]


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
