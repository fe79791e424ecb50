"""The job on a real Spark standalone cluster (scripts/cluster: a master and two 1-core
workers, each in a mount namespace where the repository does not exist), with the job's
Python environment shipped as an archive (scripts/package). Every run is a fresh driver
process: the test session's own SparkContext is local and cannot be reused."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest

from pipeline.sample import order
from tests.cluster.conftest import CLUSTER_DIR, STATE_DIR, WORKERS, cluster_command
from tests.helpers import (
    ROOT,
    create_topic,
    init_db,
    make_settings,
    produce_orders,
    query,
    run_cli,
    stored_offsets,
    toml_config,
    unique,
    watermarks,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3
PER_PARTITION = 150
VENV_BIN = ROOT / ".venv" / "bin"


def jars() -> str:
    jar_dir = Path(os.environ.get("PIPELINE_JARS_DIR") or ROOT / ".jars" / "spark")
    return ",".join(sorted(str(p) for p in jar_dir.glob("*.jar")))


def driver_env() -> dict[str, str]:
    """The submitting machine's environment as scripts/test leaves it: PYSPARK_PYTHON is
    the repository's venv, which the workers cannot see; nothing on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": str(VENV_BIN / "python"),
                "PATH": f"{VENV_BIN}:{env.get('PATH', '')}"})
    return env


def spark_conf_lines(master: str, archive: Path | None,
                     extra: dict[str, str] | None = None) -> str:
    """[spark] for the cluster. spark.cores.max + minRegisteredResourcesRatio: the first
    tasks wait until both executors are registered, so both workers get tasks. ``extra``:
    more [spark.conf] keys (e.g. spark.executorEnv.PIPELINE_FAULT)."""
    conf = {"spark.driver.host": "127.0.0.1", "spark.cores.max": str(WORKERS),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.executor.memory": "1g"}
    if archive is not None:
        conf.update({"spark.archives": f"{archive}#job",
                     "spark.pyspark.python": "./job/bin/python"})
    conf.update(extra or {})
    return f'[spark]\nmaster = "{master}"\n[spark.conf]\n' + "".join(
        f'"{k}" = "{v}"\n' for k, v in conf.items())


def setup_pipeline(tmp_path: Path, master: str, archive: Path | None, *,
                   per_partition: int = PER_PARTITION, extra: dict[str, str] | None = None):
    """A fresh topic with PARTITIONS x per_partition orders, its tables and a config file.
    Returns (name, topic, config path, order ids per partition in offset order)."""
    name, topic = unique("cl"), unique("cl_orders")
    create_topic(topic, PARTITIONS)
    ids = {p: list(range(p * 1_000_000, p * 1_000_000 + per_partition))
           for p in range(PARTITIONS)}
    for p, part_ids in ids.items():
        produce_orders(topic, part_ids, partition=p)
    init_db(make_settings(name, [topic]))
    path = tmp_path / f"{name}.toml"
    write_config(path, name, topic, master, archive, extra)
    return name, topic, path, ids


def write_config(path: Path, name: str, topic: str, master: str, archive: Path | None,
                 extra: dict[str, str] | None = None) -> Path:
    text = toml_config(name, [topic]).replace('[spark]\nmaster = "local[2]"\n',
                                              spark_conf_lines(master, archive, extra))
    assert "local[2]" not in text
    path.write_text(text)
    return path


def expected_rows(topic: str, ids: dict[int, list[int]]) -> list[tuple]:
    """What was produced, as the results table must hold it (offsets in production order)."""
    rows = []
    for p, part_ids in ids.items():
        for offset, i in enumerate(part_ids):
            doc = json.loads(order(i))
            rows.append((topic, p, offset, doc["order_id"], doc["customer"],
                         Decimal(str(doc["amount"])), datetime.fromisoformat(doc["placed_at"])))
    return sorted(rows)


def assert_landed_exactly(name: str, topic: str, ids: dict[int, list[int]]) -> None:
    got = query(f'SELECT topic, "partition", "offset", order_id, customer, amount, placed_at '
                f'FROM {name} ORDER BY 1, 2, 3')
    assert got == expected_rows(topic, ids)
    high = {p: hi for p, (_lo, hi) in watermarks(topic).items()}
    assert high == {p: len(v) for p, v in ids.items()}
    assert stored_offsets(name) == {(topic, p): hi for p, hi in high.items()}


def summary(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def app_dirs() -> dict[int, set[Path]]:
    return {n: set((CLUSTER_DIR / f"worker-{n}" / "work").glob("app-*"))
            for n in range(1, WORKERS + 1)}


def workers_with_tasks(before: dict[int, set[Path]]) -> set[int]:
    """Workers whose executors of the application(s) started since `before` ran a task."""
    ran = set()
    for n, dirs in app_dirs().items():
        for app in dirs - before[n]:
            if any("Finished task" in f.read_text(errors="replace")
                   for f in app.glob("*/stderr")):
                ran.add(n)
    return ran


def run_cli_submit(master: str, archive: Path, config: Path):
    """spark-submit in client mode, the environment shipped with --archives."""
    cmd = [str(VENV_BIN / "spark-submit"), "--master", master, "--jars", jars(),
           "--archives", f"{archive}#job",
           "--conf", "spark.pyspark.python=./job/bin/python",
           # Without it spark-submit also starts the driver with spark.pyspark.python.
           "--conf", f"spark.pyspark.driver.python={sys.executable}",
           str(ROOT / "pipeline" / "submit.py"), "run", "--config", str(config), "--json"]
    return subprocess.run(cmd, cwd=ROOT, env=driver_env(), capture_output=True, text=True,
                          timeout=300, start_new_session=True)


def test_spark_submit_to_the_cluster_lands_every_record_once(cluster, job_archive, tmp_path):
    name, topic, config, ids = setup_pipeline(tmp_path, cluster, archive=None)
    before = app_dirs()
    done = run_cli_submit(cluster, job_archive, config)
    assert done.returncode == 0, done.stderr[-3000:]
    result = summary(done.stdout)
    total = PARTITIONS * PER_PARTITION
    assert (result["status"], result["records_read"], result["rows_written"]) == \
        ("succeeded", total, total)
    assert_landed_exactly(name, topic, ids)
    assert workers_with_tasks(before) == set(range(1, WORKERS + 1))


def test_pipeline_run_with_a_cluster_master_lands_every_record_once(cluster, job_archive,
                                                                    tmp_path):
    """Client mode without spark-submit: [spark] master = "spark://..." and the archive
    in [spark.conf]."""
    name, topic, config, ids = setup_pipeline(tmp_path, cluster, archive=job_archive)
    before = app_dirs()
    done = run_cli("run", "--config", str(config), "--json", env=driver_env())
    assert done.returncode == 0, done.stderr[-3000:]
    result = summary(done.stdout)
    total = PARTITIONS * PER_PARTITION
    assert (result["status"], result["records_read"], result["rows_written"]) == \
        ("succeeded", total, total)
    assert_landed_exactly(name, topic, ids)
    assert workers_with_tasks(before) == set(range(1, WORKERS + 1))


def test_without_the_shipped_environment_the_run_fails_and_commits_nothing(cluster, tmp_path):
    """The workers cannot see the repository's .venv (what PYSPARK_PYTHON names here)."""
    # Today (to become one error: line): every task attempt fails with
    #   java.io.IOException: Cannot run program "<repo>/.venv/bin/python": error=2,
    #   No such file or directory
    # and the job exits 1 with
    #   error: internal error (Py4JJavaError: An error occurred while calling
    #   z:org.apache.spark.api.python.PythonRDD.collectAndServe.); nothing committed; rerun
    #   with -v for the traceback and report it
    # With no PYSPARK_PYTHON at all, the workers' own python3 runs instead and each task
    # fails with "ModuleNotFoundError: No module named 'pipeline'".
    name, topic, config, _ids = setup_pipeline(tmp_path, cluster, archive=None)
    done = run_cli("run", "--config", str(config), env=driver_env())
    assert done.returncode != 0, done.stdout
    assert query(f"SELECT count(*) FROM {name}") == [(0,)]
    assert stored_offsets(name) == {}
