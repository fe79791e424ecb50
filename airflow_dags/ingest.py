"""
### pipeline_ingest: scheduled Kafka → Spark → Postgres ingestion

Every run submits `pipeline/submit.py run --config <config> --json` with spark-submit.
The job reads each partition from the next offset stored in Postgres up to the latest
(last stable) offset and publishes the results, dead letters, its run row and the new
offsets in **one** transaction: a failed or killed run leaves nothing behind, and the
next run starts where the stored offsets say. A run with nothing new to read is a cheap
no-op (no Spark job). The task's XCom is the job's JSON summary.

* **Schedule**: env `PIPELINE_SCHEDULE` (default `*/5 * * * *`), no catch-up, one run
  at a time (the job also holds a per-pipeline lock in Postgres).
* **Config**: param `config` (default env `PIPELINE_CONFIG`, else `conf/local.toml`).
* **Exit codes**: `0` success · `75` transient (Kafka/Postgres unreachable, another run
  in the way) and `143` terminated → retried with exponential backoff · `2` config,
  `3` data, `1` internal error → the task fails at once, no retry; the job's one-line
  `error: ...` is the failure message. Fix the cause, then clear the task.

Before the first run: `pipeline init-db --config <config>`. See docs/airflow.md.
"""

from __future__ import annotations

import os
from datetime import UTC, datetime

from _common import DEFAULT_CONFIG, PipelineSubmitOperator, default_args
from airflow.sdk import DAG, Param

with DAG(
    dag_id="pipeline_ingest",
    description="Kafka offset ranges → Spark → Postgres, results and offsets in one transaction",
    schedule=os.environ.get("PIPELINE_SCHEDULE") or "*/5 * * * *",
    start_date=datetime(2025, 1, 1, tzinfo=UTC),
    catchup=False,
    max_active_runs=1,
    default_args=default_args(),
    params={"config": Param(DEFAULT_CONFIG, type="string", minLength=1,
                            description="Pipeline TOML config on the worker")},
    doc_md=__doc__,
    tags=["pipeline", "kafka", "spark"],
):
    PipelineSubmitOperator(
        task_id="ingest",
        application_args=["run", "--config", "{{ params.config }}", "--json"],
        doc_md="`spark-submit pipeline/submit.py run --config <param config> --json` with the "
        "job venv's spark-submit; XCom: the job's JSON summary.",
    )
