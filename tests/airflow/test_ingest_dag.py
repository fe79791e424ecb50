"""The ingestion DAG end to end: dag.test() submits the real job with the job venv's
spark-submit against the real Kafka and Postgres; its exit code decides the retries."""

from __future__ import annotations

import subprocess

import pytest

from tests.airflow.conftest import new_pipeline, task
from tests.helpers import ROOT, query, result_keys, stored_offsets, toml_config, watermarks

pytestmark = pytest.mark.airflow

SUBMIT = "Spark-Submit cmd:"


def runs_of(pipeline: str) -> list[tuple]:
    return query("SELECT kind, status, records_read, rows_written FROM pipeline_runs "
                 "WHERE pipeline = %s ORDER BY run_id", (pipeline,))


def test_ingest_dag_lands_records_and_offsets(stack, airflow, tmp_path):
    p = new_pipeline(tmp_path, "af_ingest", partitions=2, records=20)

    # Two scheduled runs in a row: the first reads everything, the second finds nothing new.
    first, second = airflow.dag_test("pipeline_ingest", None, None,
                                     env={"PIPELINE_CONFIG": str(p.config)})

    assert first["state"] == "success", first["log"][-4000:]
    assert task(first, "ingest")["state"] == "success"
    assert task(first, "ingest")["try_number"] == 1
    assert f"{SUBMIT} {ROOT}/.venv/bin/spark-submit --master local[2]" in first["log"]
    ends = {(p.name, part): high for part, (_, high) in watermarks(p.name).items()}
    assert sum(ends.values()) == 20
    assert stored_offsets(p.name) == ends
    assert result_keys(p.name) == sorted(
        (p.name, part, offset) for (_, part), high in ends.items() for offset in range(high))
    summary = first["xcom"]["ingest"]  # the job's --json summary, pushed by the operator
    assert (summary["kind"], summary["status"], summary["rows_written"]) == (
        "ingest", "succeeded", 20)

    assert second["state"] == "success", second["log"][-4000:]
    assert second["xcom"]["ingest"]["status"] == "noop"
    assert runs_of(p.name)[0] == ("ingest", "succeeded", 20, 20)
    assert [r[:2] for r in runs_of(p.name)] == [("ingest", "succeeded"), ("ingest", "noop")]
    assert stored_offsets(p.name) == ends
    assert len(result_keys(p.name)) == 20


@pytest.fixture(scope="module")
def failing_runs(stack, airflow, tmp_path_factory):
    """One run whose job exits 2 (an unknown config key: permanent) and one whose job exits
    75 (Postgres unreachable: transient), both with one retry allowed, 1 s apart."""
    directory = tmp_path_factory.mktemp("failing")
    p = new_pipeline(directory, "af_fail", partitions=1, records=3)
    bad = directory / "bad_key.toml"
    bad.write_text(toml_config(p.name, [p.name]).replace("[kafka]", 'colour = "red"\n[kafka]'))
    no_db = directory / "no_db.toml"
    no_db.write_text(toml_config(p.name, [p.name],
                                 db_url="postgresql://postgres@127.0.0.1:1/pipeline_test"))
    permanent, transient = airflow.dag_test(
        "pipeline_ingest", {"config": str(bad)}, {"config": str(no_db)},
        env={"PIPELINE_RETRIES": "1", "PIPELINE_RETRY_DELAY_SECONDS": "1"})
    return p, permanent, transient


def test_permanent_exit_code_fails_at_once_with_the_jobs_error(failing_runs):
    p, permanent, _ = failing_runs
    ti = task(permanent, "ingest")
    assert permanent["state"] == "failed"
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 1, 1)
    assert permanent["log"].count(SUBMIT) == 1  # submitted once, not retried
    failure = [line for line in permanent["log"].splitlines()
               if line.startswith("airflow.sdk.exceptions.AirflowFailException: ")]
    assert len(failure) == 1, permanent["log"][-4000:]
    assert "pipeline exited 2 (permanent: bad configuration" in failure[0]
    assert "error: unknown key 'pipeline.colour' in config" in failure[0]
    assert runs_of(p.name) == []


def test_transient_exit_code_is_retried(failing_runs):
    _, _, transient = failing_runs
    ti = task(transient, "ingest")
    assert transient["state"] == "failed"
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 2, 1)
    assert transient["log"].count(SUBMIT) == 2
    retried = [line for line in transient["log"].splitlines()
               if line.startswith("_common.PipelineTransientError: pipeline exited 75")]
    assert len(retried) == 2, transient["log"][-4000:]
    assert "error: Postgres unreachable at postgresql://postgres@127.0.0.1:1/" in retried[0]


def test_stopped_task_terminates_the_job_which_rolls_back(stack, airflow, tmp_path):
    """Airflow stops a task that overruns its execution_timeout (as when it is marked failed
    or its worker shuts down): the job must get SIGTERM, roll back, record the run as failed
    with exit 143 and exit - not linger as an orphan once spark-submit is killed."""
    p = new_pipeline(tmp_path, "af_stop", partitions=1, records=5)
    [run] = airflow.dag_test("pipeline_ingest", None, env={
        "PIPELINE_CONFIG": str(p.config), "PIPELINE_RETRIES": "0",
        "PIPELINE_TASK_TIMEOUT_SECONDS": "60",
        "PIPELINE_FAULT": "after_stage:sleep=600"})  # the job's own fault-injection point

    assert run["state"] == "failed"
    ti = task(run, "ingest")
    assert (ti["state"], ti["try_number"]) == ("failed", 1)
    assert "AirflowTaskTimeout" in run["log"]
    assert "sending SIGTERM to the pipeline driver" in run["log"]
    lingering = subprocess.run(["pgrep", "-f", str(p.config)], capture_output=True, text=True)
    assert lingering.stdout == "", f"job processes still running: {lingering.stdout}"
    [(kind, status, exit_code, error)] = query(
        "SELECT kind, status, exit_code, error FROM pipeline_runs WHERE pipeline = %s",
        (p.name,))
    assert (kind, status, exit_code) == ("ingest", "failed", 143)
    assert "SIGTERM" in error
    assert result_keys(p.name) == []
    assert stored_offsets(p.name) == {}
