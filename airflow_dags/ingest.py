"""
### <pipeline>.ingest: scheduled Kafka → Spark → Postgres ingestion

One such DAG per config file in `PIPELINE_CONFIG_DIR`, named after its pipeline. Every run
submits `pipeline/submit.py run --config <that config>` with spark-submit.
The job reads each partition from the next offset stored in Postgres up to the latest
(last stable) offset and publishes the results, dead letters, its run row and the new
offsets in **one** transaction: a failed or killed run leaves nothing behind, and the
next run starts where the stored offsets say. A run with nothing new to read is a cheap
no-op (no Spark job). The task's XCom is the job's JSON summary.

* **Schedule**: the config's `[airflow] schedule`, else env `PIPELINE_SCHEDULE` (default
  `*/5 * * * *`), no catch-up, one run at a time (the job also holds a per-pipeline lock
  in Postgres). Retries, owner, tags, pool, queue and the connections
  (`spark_conn_id`, `postgres_conn_id`, `kafka_conn_id`) also come from `[airflow]`.
* **Config**: the file this DAG was built from (see the task's arguments).
* **Exit codes**: `0` success · `75` transient (Kafka/Postgres unreachable, another run
  in the way) and `143` terminated → retried with exponential backoff · `2` config,
  `3` data, `1` internal error → the task fails at once, no retry; the job's one-line
  `error: ...` is the failure message. Fix the cause, then clear the task.
* **A config or setting with a mistake** (the config cannot be read, a schedule Airflow
  refuses, a bad `PIPELINE_*` value): the task fails at once, before anything is
  submitted, saying what to fix.

Before the first run: `pipeline init-db --config <config>`. See docs/airflow.md.
"""

from __future__ import annotations

from airflow.sdk import DAG
from pipeline_airflow.configs import pipeline_configs
from pipeline_airflow.dag_settings import dag_settings
from pipeline_airflow.operator import PipelineSubmitOperator

for pipeline in pipeline_configs():
    settings = dag_settings(pipeline, scheduled=True)
    with DAG(
        dag_id=f"{pipeline.name}.ingest",
        description=f"{pipeline.name}: Kafka offset ranges → Spark → Postgres, results and "
        "offsets in one transaction",
        doc_md=__doc__,
        **settings.dag,
    ):
        PipelineSubmitOperator(
            task_id="ingest",
            application_args=["run", "--config", str(pipeline.path)],
            config=pipeline.path,
            **settings.task,
            doc_md=f"`spark-submit pipeline/submit.py run --config {pipeline.path}` with the "
            "job venv's spark-submit; XCom: the job's JSON summary.",
        )
