"""The ingestion DAG end to end: dag.test() submits the real job with the job venv's
spark-submit against the real Kafka and Postgres; its exit code decides the retries."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.airflow.conftest import dag_env, new_pipeline, task
from tests.helpers import (
    ROOT,
    query,
    result_keys,
    run_cli,
    stored_offsets,
    toml_config,
    watermarks,
)

pytestmark = pytest.mark.airflow

SUBMIT = "spark-submit command:"


def runs_of(pipeline: str) -> list[tuple]:
    return query("SELECT kind, status, records_read, rows_written FROM pipeline_runs "
                 "WHERE pipeline = %s ORDER BY run_id", (pipeline,))


def test_ingest_dags_of_two_pipelines_each_land_their_own_records(stack, airflow, tmp_path):
    # One config folder, two pipelines: the factory gives each its own ingest DAG.
    a = new_pipeline(tmp_path, "af_ingest", partitions=2, records=20)
    b = new_pipeline(tmp_path, "af_other", partitions=1, records=7)

    # Two scheduled runs of a in a row: the first reads everything, the second finds nothing;
    # then one of b.
    first, second, other = airflow.dag_tests([(a.ingest, None), (a.ingest, None),
                                              (b.ingest, None)], env=dag_env(tmp_path))

    assert first["state"] == "success", first["log"][-4000:]
    assert task(first, "ingest")["state"] == "success"
    assert task(first, "ingest")["try_number"] == 1
    assert f"{SUBMIT} {ROOT}/.venv/bin/spark-submit --master local[2]" in first["log"]
    assert f"run --config {a.config} --summary-file " in first["log"]
    ends = {(a.name, part): high for part, (_, high) in watermarks(a.name).items()}
    assert sum(ends.values()) == 20
    assert stored_offsets(a.name) == ends
    assert result_keys(a.name) == sorted(
        (a.name, part, offset) for (_, part), high in ends.items() for offset in range(high))
    # The XCom is the summary the job wrote to the file the operator named; stdout, free
    # of it, carries the job's summary for people into the task log.
    summary = first["xcom"]["ingest"]
    assert (summary["kind"], summary["status"], summary["rows_written"]) == (
        "ingest", "succeeded", 20)
    assert f"run {summary['run_id']} (ingest) succeeded: 20 records, 20 rows written" in (
        first["log"])

    assert second["state"] == "success", second["log"][-4000:]
    assert second["xcom"]["ingest"]["status"] == "noop"
    assert runs_of(a.name)[0] == ("ingest", "succeeded", 20, 20)
    assert [r[:2] for r in runs_of(a.name)] == [("ingest", "succeeded"), ("ingest", "noop")]
    assert stored_offsets(a.name) == ends
    assert len(result_keys(a.name)) == 20

    # a's DAG did not touch b: b's one run is its own DAG's.
    assert other["state"] == "success", other["log"][-4000:]
    assert f"run --config {b.config} --summary-file " in other["log"]
    assert runs_of(b.name) == [("ingest", "succeeded", 7, 7)]
    assert [run_id for (run_id,) in query("SELECT run_id FROM pipeline_runs WHERE pipeline = "
                                          "%s", (b.name,))] == [other["xcom"]["ingest"]["run_id"]]
    assert result_keys(b.name) == [(b.name, 0, offset) for offset in range(7)]
    assert len(result_keys(a.name)) == 20


@pytest.fixture(scope="module")
def failing_runs(stack, airflow, tmp_path_factory):
    """Two pipelines on one topic: one whose job exits 2 (an unknown config key: permanent)
    and one whose job exits 75 (Postgres unreachable: transient), both with one retry
    allowed, 1 s apart."""
    directory = tmp_path_factory.mktemp("failing")
    topic = new_pipeline(directory / "topic", "af_fail", partitions=1, records=3).name
    bad, no_db = f"{topic}_bad", f"{topic}_nodb"
    (directory / "bad_key.toml").write_text(
        toml_config(bad, [topic]).replace("[kafka]", 'colour = "red"\n[kafka]'))
    (directory / "no_db.toml").write_text(toml_config(
        no_db, [topic], db_url="postgresql://postgres@127.0.0.1:1/pipeline_test"))
    env = dag_env(directory, PIPELINE_RETRIES="1", PIPELINE_RETRY_DELAY_SECONDS="1")
    permanent, transient = airflow.dag_tests([(f"{bad}.ingest", None),
                                              (f"{no_db}.ingest", None)], env=env)
    return bad, permanent, transient


def test_permanent_exit_code_fails_at_once_with_the_jobs_error(failing_runs):
    bad, permanent, _ = failing_runs
    ti = task(permanent, "ingest")
    assert permanent["state"] == "failed"
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 1, 1)
    assert permanent["log"].count(SUBMIT) == 1  # submitted once, not retried
    failure = [line for line in permanent["log"].splitlines()
               if line.startswith("airflow.sdk.exceptions.AirflowFailException: ")]
    assert len(failure) == 1, permanent["log"][-4000:]
    assert "pipeline exited 2 (permanent: bad configuration" in failure[0]
    assert "error: unknown key 'pipeline.colour' in config" in failure[0]
    assert runs_of(bad) == []


def test_transient_exit_code_is_retried(failing_runs):
    _, _, transient = failing_runs
    ti = task(transient, "ingest")
    assert transient["state"] == "failed"
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 2, 1)
    assert transient["log"].count(SUBMIT) == 2
    retried = [line for line in transient["log"].splitlines()
               if line.startswith("pipeline_airflow.outcome.PipelineTransientError: pipeline "
                                  "exited 75")]
    assert len(retried) == 2, transient["log"][-4000:]
    assert "error: Postgres unreachable at postgresql://postgres@127.0.0.1:1/" in retried[0]


def test_stopped_task_terminates_the_job_which_rolls_back(stack, airflow, tmp_path):
    """Airflow stops a task that overruns its execution_timeout (as when it is marked failed
    or its worker shuts down): the job must get SIGTERM, roll back, record the run as failed
    with exit 143 and exit - not linger as an orphan once spark-submit is killed."""
    p = new_pipeline(tmp_path, "af_stop", partitions=1, records=5)
    [run] = airflow.dag_test(p.ingest, None, env=dag_env(
        tmp_path, PIPELINE_RETRIES="0", PIPELINE_TASK_TIMEOUT_SECONDS="60",
        PIPELINE_FAULT="after_stage:sleep=600"))  # the job's own fault-injection point

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


def test_a_dag_with_a_config_mistake_fails_at_once_naming_it(stack, airflow, tmp_path):
    """A schedule Airflow refuses (the job cannot see it: it ignores [airflow]) keeps the
    pipeline's DAGs parsing; its runs fail before anything is submitted, without a retry,
    saying what to write instead."""
    p = new_pipeline(tmp_path, "af_cron", partitions=1, records=2)
    p.config.write_text(p.config.read_text() + '[airflow]\nschedule = "hourly"\n')
    [run] = airflow.dag_test(p.ingest, None, env=dag_env(tmp_path))
    assert run["state"] == "failed"
    ti = task(run, "ingest")
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 1, 3)
    assert SUBMIT not in run["log"]
    failure = [line for line in run["log"].splitlines()
               if line.startswith("airflow.sdk.exceptions.AirflowFailException: ")]
    assert len(failure) == 1, run["log"][-4000:]
    assert f"[airflow] schedule = 'hourly' of {p.config} is not a schedule" in failure[0]
    assert failure[0].endswith("or \"none\" - not retried")
    assert runs_of(p.name) == []


def test_the_summary_file_holds_what_json_prints(stack, tmp_path):
    """The operator's contract with the job: --summary-file gets the document --json
    prints (here a run with nothing to read), whatever else reaches stdout."""
    p = new_pipeline(tmp_path, "af_summary", partitions=1, records=0)
    summary = tmp_path / "summary.json"
    run = run_cli("run", "--config", str(p.config), "--json", "--summary-file", str(summary))
    assert run.returncode == 0, run.stderr
    assert json.loads(summary.read_text()) == json.loads(run.stdout)
    assert json.loads(run.stdout)["status"] == "noop"

    nowhere = tmp_path / "nowhere" / "summary.json"
    refused = run_cli("run", "--config", str(p.config), "--summary-file", str(nowhere))
    assert refused.returncode == 2
    assert f"--summary-file must be a file in an existing folder (got '{nowhere}')" in (
        refused.stderr)
    assert runs_of(p.name) == [("ingest", "noop", 0, 0)]
