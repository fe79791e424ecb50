"""Airflow runs in its own venv (.airflow-venv): its pins clash with the job's. These tests
therefore drive the real Airflow through tests/airflow/dag_runner.py in subprocesses, with
one throw-away AIRFLOW_HOME (SQLite, migrated once) per test session, the real DAG files,
and the real local stack underneath. Nothing is mocked."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.airflow.dag_runner import RESULT_MARKER, RUN_MARKER
from tests.conftest import STACK_DIR, stack_lock
from tests.helpers import ROOT, create_topic, init_cli, produce_orders, toml_config, unique

AIRFLOW_VENV = ROOT / ".airflow-venv"
AIRFLOW_PYTHON = AIRFLOW_VENV / "bin" / "python"
RUNNER = Path(__file__).with_name("dag_runner.py")
DAGS_FOLDER = ROOT / "airflow_dags"
SPARK_CONNECTION = '{"conn_type": "spark", "host": "local[2]"}'


@dataclass
class Airflow:
    home: Path
    env: dict[str, str]
    calls: itertools.count = field(default_factory=itertools.count)

    def run(self, *args: str, env: dict[str, str] | None = None, timeout: float = 900,
            python: Path = AIRFLOW_PYTHON) -> tuple[Any, str]:
        """dag_runner.py in the Airflow venv (or another ``python``); (its JSON result, its
        whole output). The output is also kept in AIRFLOW_HOME/runner-N.log for a failing
        test's post-mortem."""
        log = self.home / f"runner-{next(self.calls)}.log"
        t0 = time.monotonic()
        proc = subprocess.run([str(python), str(RUNNER), *args],
                              env={**self.env, **(env or {})}, cwd=self.home, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=timeout)
        log.write_text(proc.stdout)
        print(f"dag_runner {args[:2]}: {time.monotonic() - t0:.1f} s, log {log}")
        lines = [ln for ln in proc.stdout.splitlines() if ln.startswith(RESULT_MARKER)]
        assert proc.returncode == 0 and lines, (
            f"dag_runner {args} exited {proc.returncode} ({log}):\n{proc.stdout[-4000:]}")
        return json.loads(lines[-1][len(RESULT_MARKER):]), proc.stdout

    def dag_test(self, dag_id: str, *confs: dict | None, env: dict[str, str] | None = None,
                 python: Path = AIRFLOW_PYTHON) -> list[dict]:
        """One dag.test() per conf, in one Airflow process; each result carries its log."""
        return self.dag_tests([(dag_id, conf) for conf in confs or (None,)], env=env,
                              python=python)

    def dag_tests(self, runs: list[tuple[str, dict | None]], env: dict[str, str] | None = None,
                  python: Path = AIRFLOW_PYTHON) -> list[dict]:
        """One dag.test() per (DAG id, conf), in this order, in one Airflow process (each
        start of Airflow costs ~10 CPU-s); each result carries its log."""
        results, output = self.run("runs", json.dumps(runs), env=env, python=python)
        for result, segment in zip(results, output.split(RUN_MARKER)[1:], strict=True):
            result["log"] = segment
        return results


@pytest.fixture(scope="session")
def airflow(tmp_path_factory) -> Airflow:
    """A fresh AIRFLOW_HOME on SQLite; its database is migrated once per run of the suite
    (copy_migrated_database)."""
    subprocess.run([str(ROOT / "scripts" / "stack"), "airflow"], check=True)  # idempotent
    home = tmp_path_factory.mktemp("airflow_home")
    job_bin = str(ROOT / ".venv" / "bin")
    # Nothing of the outer environment may steer Airflow or the job: no AIRFLOW_* settings,
    # no PIPELINE__DATABASE__URL pointing at the real database, no job venv on PATH (the DAG
    # must find spark-submit and the job's python by itself).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "PIPELINE_", "PYSPARK_", "SPARK_HOME", "VIRTUAL_ENV",
                                "PYTEST_"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p != job_bin)
    env.update({
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW_CONN_SPARK_LOCAL": SPARK_CONNECTION,
        "SPARK_LOCAL_IP": "127.0.0.1",
        "PYTHONUNBUFFERED": "1",
    })
    copy_migrated_database(env, home / "airflow.db")
    return Airflow(home, env)


def copy_migrated_database(env: dict[str, str], to: Path) -> None:
    """An Airflow metadata database migrated once per run of the suite and copied into each
    pytest process's AIRFLOW_HOME: a migration costs a minute of CPU here, and the xdist
    workers would each pay it. Keyed by the run (scripts/test's PIPELINE_TEST_RUN, or
    xdist's run id); a lone pytest migrates its own."""
    run = os.environ.get("PIPELINE_TEST_RUN") or os.environ.get("PYTEST_XDIST_TESTRUNUID")
    template = STACK_DIR / "airflow-home-template"
    with stack_lock():
        stamp = template / "run"
        if not run or not stamp.exists() or stamp.read_text() != run:
            shutil.rmtree(template, ignore_errors=True)
            template.mkdir(parents=True)
            t0 = time.monotonic()
            proc = subprocess.run([str(AIRFLOW_VENV / "bin" / "airflow"), "db", "migrate"],
                                  env={**env, "AIRFLOW_HOME": str(template)}, cwd=template,
                                  text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            assert proc.returncode == 0, f"airflow db migrate failed:\n{proc.stdout[-4000:]}"
            print(f"airflow db migrate: {time.monotonic() - t0:.1f} s in {template}")
            stamp.write_text(run or "")
        shutil.copyfile(template / "airflow.db", to)


@dataclass
class Pipeline:
    name: str  # pipeline name = topic = results table
    config: Path

    @property
    def ingest(self) -> str:
        return f"{self.name}.ingest"  # the DAG ids the factory gives this pipeline

    @property
    def backfill(self) -> str:
        return f"{self.name}.backfill"


def dag_env(config_dir: Path, **more: str) -> dict[str, str]:
    """The environment of a DAG run whose pipelines are the configs in ``config_dir``."""
    return {"PIPELINE_CONFIG_DIR": str(config_dir), **more}


def new_pipeline(directory: Path, prefix: str, *, partitions: int = 2, records: int = 20,
                 **config_kwargs: str) -> Pipeline:
    """A unique topic with `records` orders, a TOML config in ``directory`` (the DAGs'
    PIPELINE_CONFIG_DIR) pointing at pipeline_test, and its tables (pipeline init-db, run
    with the job venv like a deployment step)."""
    name = unique(prefix)
    create_topic(name, partitions)
    produce_orders(name, range(records))
    directory.mkdir(parents=True, exist_ok=True)
    config = directory / f"{name}.toml"
    config.write_text(toml_config(name, [name], **config_kwargs))
    init_cli(config)  # as the owner, then the job role's grants
    return Pipeline(name, config)


def task(result: dict, task_id: str) -> dict:
    return result["tasks"][task_id]
