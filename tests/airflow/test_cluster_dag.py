"""Both DAGs submitting to the Spark standalone cluster (scripts/cluster: workers that cannot
see the repository) through a spark://... connection: the operator ships the packed job
environment (scripts/package) with --archives, runs the executors' Python from it and
keeps the driver on the job venv. dag.test() against the real cluster, Kafka and Postgres."""

from __future__ import annotations

import json

import pytest

from tests.airflow.conftest import dag_env, new_pipeline, task
from tests.cluster import conftest as cluster_fixtures
from tests.cluster.conftest import app_dirs, workers_with_tasks
from tests.helpers import ROOT, TEST_DB_URL, query, result_keys, stored_offsets, watermarks

pytestmark = pytest.mark.airflow

# The cluster's session fixtures (tests/cluster/conftest.py), shared rather than copied.
cluster = cluster_fixtures.cluster
job_archive = cluster_fixtures.job_archive

SUBMIT = "spark-submit command:"
CONN_ID = "spark_cluster"


def cluster_env(master: str, **more: str) -> dict[str, str]:
    """A spark connection whose host is the master URL, as the Airflow UI stores it."""
    return {f"AIRFLOW_CONN_{CONN_ID.upper()}": json.dumps({"conn_type": "spark",
                                                            "host": master}),
            "PIPELINE_SPARK_CONN_ID": CONN_ID, **more}


def submit_line(log: str) -> str:
    [line] = [ln for ln in log.splitlines() if SUBMIT in ln]
    return line


def runs_of(pipeline: str) -> list[tuple]:
    return query("SELECT kind, status, records_read, rows_written FROM pipeline_runs "
                 "WHERE pipeline = %s ORDER BY run_id", (pipeline,))


def test_ingest_and_backfill_dags_submit_to_the_cluster_with_the_packed_environment(
        stack, airflow, cluster, job_archive, tmp_path):
    # As the owner: the workers cannot see the CA file the job role's TLS needs.
    p = new_pipeline(tmp_path, "af_cluster", partitions=2, records=40, db_url=TEST_DB_URL)
    env = cluster_env(cluster, **dag_env(tmp_path))

    before = app_dirs()
    # The ingest, then a backfill re-reading partition 0 (its end known in advance: 40
    # records over 2 partitions), in one Airflow process.
    ingest, backfill = airflow.dag_tests([(p.ingest, None), (p.backfill, {
        "topic": p.name, "partitions": [0], "from_offset": 0,
        "to_offset": watermarks(p.name)[0][1]})], env=env)
    assert ingest["state"] == "success", ingest["log"][-4000:]
    assert task(ingest, "ingest")["try_number"] == 1
    cmd = submit_line(ingest["log"])
    assert f"--master {cluster} " in cmd
    assert f"--archives {job_archive}#job " in cmd
    assert "--conf spark.pyspark.python=./job/bin/python " in cmd
    assert f"--conf spark.pyspark.driver.python={ROOT}/.venv/bin/python " in cmd
    # The executors ran on the workers, which only had what was shipped.
    assert workers_with_tasks(before)
    summary = ingest["xcom"]["ingest"]
    assert (summary["status"], summary["records_read"], summary["rows_written"]) == (
        "succeeded", 40, 40)
    ends = {(p.name, part): high for part, (_, high) in watermarks(p.name).items()}
    assert sum(ends.values()) == 40
    assert stored_offsets(p.name) == ends
    keys = sorted((p.name, part, o) for (_, part), high in ends.items() for o in range(high))
    assert result_keys(p.name) == keys

    # The re-read of partition 0 on the cluster: nothing added, the offsets stay.
    high0 = ends[(p.name, 0)]
    assert backfill["state"] == "success", backfill["log"][-4000:]
    cmd = submit_line(backfill["log"])
    assert f"--master {cluster} " in cmd and f"--archives {job_archive}#job " in cmd
    summary = backfill["xcom"]["backfill"]
    assert (summary["kind"], summary["status"], summary["records_read"],
            summary["rows_written"]) == ("backfill", "succeeded", high0, 0)
    assert result_keys(p.name) == keys
    assert stored_offsets(p.name) == ends
    assert runs_of(p.name) == [("ingest", "succeeded", 40, 40),
                               ("backfill", "succeeded", high0, 0)]


def test_a_cluster_master_without_the_archive_fails_at_once(stack, airflow, tmp_path):
    """No packed environment to ship: the task fails before spark-submit, without retries,
    saying how to build it. (No cluster needed: nothing is submitted.)"""
    p = new_pipeline(tmp_path, "af_noarch", partitions=1, records=3)
    missing = tmp_path / "nowhere" / "pipeline-env.tar.gz"
    [run] = airflow.dag_test(p.ingest, None, env=cluster_env(
        "spark://127.0.0.1:7077", **dag_env(tmp_path), PIPELINE_ARCHIVE=str(missing)))
    assert run["state"] == "failed"
    ti = task(run, "ingest")
    assert (ti["state"], ti["try_number"]) == ("failed", 1)
    assert SUBMIT not in run["log"]
    failure = [line for line in run["log"].splitlines()
               if line.startswith("airflow.sdk.exceptions.AirflowFailException: ")]
    assert len(failure) == 1, run["log"][-4000:]
    assert str(missing) in failure[0] and "scripts/package" in failure[0]
    assert runs_of(p.name) == []
