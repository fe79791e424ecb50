"""The backfill DAG: params are refused before anything is submitted; a valid range is
re-read by the real job without duplicating a row or moving the stored offsets."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.airflow.conftest import dag_env, new_pipeline, task
from tests.helpers import query, result_keys, run_cli, stored_offsets, toml_config, watermarks

pytestmark = pytest.mark.airflow

SUBMIT = "spark-submit command:"


def failure_line(result: dict, exception: str) -> str:
    lines = [ln for ln in result["log"].splitlines() if ln.startswith(exception + ": ")]
    assert len(lines) == 1, result["log"][-4000:]
    return lines[0]


@pytest.fixture(scope="module")
def backfilled(stack, airflow, tmp_path_factory):
    """20 orders ingested by the CLI, then three backfill DAG runs of the same pipeline:
    an offset range of partition 0, a time range of every partition with reprocess, and an
    offset range beyond the end of partition 0 (the job exits 3)."""
    directory = tmp_path_factory.mktemp("backfill")
    since = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    p = new_pipeline(directory, "af_backfill", partitions=2, records=20)
    run = run_cli("run", "--config", str(p.config))
    assert run.returncode == 0, run.stderr
    before = {"keys": result_keys(p.name), "offsets": stored_offsets(p.name),
              "marks": watermarks(p.name)}
    assert len(before["keys"]) == 20
    end0 = before["marks"][0][1]
    common = {"topic": p.name}
    results = airflow.dag_test(
        p.backfill,
        {**common, "partitions": [0], "from_offset": 0, "to_offset": end0},
        {**common, "from_time": since, "reprocess": True,
         "to_time": (datetime.now(UTC) + timedelta(hours=1)).isoformat()},
        {**common, "partitions": [0], "from_offset": 0, "to_offset": end0 + 5},
        env=dag_env(directory, PIPELINE_RETRIES="1", PIPELINE_RETRY_DELAY_SECONDS="1"))
    runs = query("SELECT run_id, kind, status, records_read, rows_written, planned "
                 "FROM pipeline_runs WHERE pipeline = %s ORDER BY run_id", (p.name,))
    return p, before, results, runs


def test_backfill_of_ingested_range_adds_no_duplicates(backfilled):
    p, before, (offsets_run, _, _), runs = backfilled
    end0 = before["marks"][0][1]
    assert offsets_run["state"] == "success", offsets_run["log"][-4000:]
    assert task(offsets_run, "validate_params")["state"] == "success"
    assert task(offsets_run, "backfill")["try_number"] == 1
    summary = offsets_run["xcom"]["backfill"]
    assert (summary["kind"], summary["status"]) == ("backfill", "succeeded")
    assert (summary["records_read"], summary["rows_written"]) == (end0, 0)
    # One run row of kind backfill, over exactly the requested range; nothing else moved.
    backfill_runs = [r for r in runs if r[1] == "backfill"]
    assert len(backfill_runs) == 1
    _, _, status, read, written, planned = backfill_runs[0]
    assert (status, read, written) == ("succeeded", end0, 0)
    assert [(r["partition"], r["from"], r["until"]) for r in planned] == [(0, 0, end0)]
    assert result_keys(p.name) == before["keys"]
    assert stored_offsets(p.name) == before["offsets"]


def test_reprocess_of_a_time_range_rewrites_rows_in_place(backfilled):
    p, before, (_, time_run, _), runs = backfilled
    assert time_run["state"] == "success", time_run["log"][-4000:]
    summary = time_run["xcom"]["backfill"]
    assert (summary["kind"], summary["status"], summary["records_read"]) == (
        "reprocess", "succeeded", 20)
    reprocess_runs = [r for r in runs if r[1] == "reprocess"]
    assert len(reprocess_runs) == 1 and reprocess_runs[0][2] == "succeeded"
    assert result_keys(p.name) == before["keys"]
    owners = query(f"SELECT DISTINCT run_id FROM {p.name}")
    assert owners == [(reprocess_runs[0][0],)]  # every row rewritten by the reprocess run
    assert stored_offsets(p.name) == before["offsets"]


def test_job_refusing_the_range_fails_without_retry(backfilled):
    p, before, (_, _, beyond, ), runs = backfilled
    assert beyond["state"] == "failed"
    assert task(beyond, "validate_params")["state"] == "success"
    ti = task(beyond, "backfill")
    assert (ti["state"], ti["try_number"], ti["max_tries"]) == ("failed", 1, 1)
    assert beyond["log"].count(SUBMIT) == 1
    line = failure_line(beyond, "airflow.sdk.exceptions.AirflowFailException")
    assert "pipeline exited 3 (permanent: data problem" in line
    assert "is outside what Kafka holds" in line
    assert [r[1] for r in runs] == ["ingest", "backfill", "reprocess"]  # no run row for it


INVALID_BY_SCHEMA = [
    ({}, "param topic: No value passed"),
    ({"topic": "orders", "partitions": ["0"]}, "param partitions"),
    ({"topic": "orders", "partitions": [1, 1]}, "param partitions"),
    ({"topic": "orders", "from_offset": -1, "to_offset": 5}, "param from_offset"),
    ({"topic": "no spaces", "from_offset": 0, "to_offset": 5}, "param topic"),
    ({"topic": "orders", "reprocess": "yes"}, "param reprocess"),
]
INVALID_BY_TASK = [
    ({"from_offset": 5}, "from_offset is set but to_offset is not"),
    ({"to_time": "2025-01-31T00:00:00Z"}, "to_time is set but from_time is not"),
    ({"from_offset": 0, "to_offset": 5, "from_time": "2025-01-31T00:00:00Z"},
     "give offsets or times, not both"),
    ({}, "give a range: from_offset and to_offset, or from_time and to_time"),
    ({"from_offset": 7, "to_offset": 7}, "from_offset 7 must be below to_offset 7"),
    ({"from_time": "yesterday", "to_time": "2025-01-31T00:00:00Z"},
     "from_time = 'yesterday' is not an ISO 8601 time"),
    ({"from_time": "2025-01-31T02:00:00+01:00", "to_time": "2025-01-31T00:30:00"},
     "from_time 2025-01-31T02:00:00+01:00 must be before to_time 2025-01-31T00:30:00"),
]


def test_invalid_params_fail_before_submission(stack, airflow, tmp_path):
    name = "af_invalid_params"
    config = tmp_path / "pipeline.toml"
    config.write_text(toml_config(name, ["orders"]))
    confs = [c for c, _ in INVALID_BY_SCHEMA]
    confs += [{"topic": "orders", **c} for c, _ in INVALID_BY_TASK]
    results = airflow.dag_test(f"{name}.backfill", *confs, env=dag_env(tmp_path))

    for result, (conf, _) in zip(results, INVALID_BY_SCHEMA + INVALID_BY_TASK, strict=True):
        assert SUBMIT not in result["log"], conf
    for result, (conf, expected) in zip(results, INVALID_BY_SCHEMA, strict=False):
        # Refused when the run is created: no run, no task.
        assert result.get("error", "").startswith("ParamValidationError: "), (conf, result)
        assert expected in result["error"], (conf, result["error"])
    for result, (conf, expected) in zip(results[len(INVALID_BY_SCHEMA):], INVALID_BY_TASK,
                                        strict=True):
        assert result["state"] == "failed", conf
        v = task(result, "validate_params")
        assert (v["state"], v["try_number"]) == ("failed", 1), conf
        assert task(result, "backfill")["state"] == "upstream_failed", conf
        line = failure_line(result, "airflow.sdk.exceptions.AirflowFailException")
        assert f"invalid backfill params: {expected}" in line, (conf, line)
    assert query("SELECT count(*) FROM pipeline_runs WHERE pipeline = %s", (name,)) == [(0,)]
