"""
### <pipeline>.backfill: re-read an explicit range of one topic (manual)

One such DAG per config file in `PIPELINE_CONFIG_DIR`, named after its pipeline. Trigger
with parameters; they are checked twice before anything is submitted: by their
JSON schema when the run is created, then by `validate_params`, which fails at once
(no retry) with a message saying what to change. Only then is
`pipeline/submit.py backfill --config <that config> --topic T [--partition P ...]
(--from-offset A --to-offset B | --from-time ISO --to-time ISO) [--reprocess]`
submitted with spark-submit.

| param | meaning |
| --- | --- |
| `topic` | the topic to re-read (one of the config's topics) |
| `partitions` | partitions to re-read; empty = all of the topic's partitions |
| `from_offset`, `to_offset` | an offset range, `[from, to)` |
| `from_time`, `to_time` | or a time range `[from, to)`, ISO 8601; no zone = UTC |
| `reprocess` | overwrite rows that exist (default: keep them, insert only missing rows) |

Give either both offsets or both times. A backfill never moves the stored offsets, and
rows are keyed by (topic, partition, offset): re-running a range adds nothing twice.

Exit codes as in `<pipeline>.ingest`: `75`/`143` retry with backoff (e.g. the scheduled
ingestion holds the pipeline's lock), everything else fails at once. The task's XCom is
the job's JSON summary.
"""

from __future__ import annotations

from airflow.sdk import DAG, task
from pipeline_airflow.backfill_params import backfill_args, backfill_params
from pipeline_airflow.configs import PipelineConfig, pipeline_configs
from pipeline_airflow.dag_settings import dag_settings
from pipeline_airflow.operator import PipelineSubmitOperator


def backfill_dag(pipeline: PipelineConfig) -> DAG:
    settings = dag_settings(pipeline, scheduled=False)
    with DAG(
        dag_id=f"{pipeline.name}.backfill",
        description=f"{pipeline.name}: re-read an explicit Kafka offset or time range into "
        "Postgres (idempotent)",
        params=backfill_params(),
        doc_md=__doc__,
        **settings.dag,
    ) as dag:

        @task(retries=0)
        def validate_params(params=None) -> list[str]:
            """Fails at once, with the reason, on params the job would refuse."""
            return backfill_args(pipeline.path, params)

        PipelineSubmitOperator(task_id="backfill", application_args=validate_params(),
                               config=pipeline.path, **settings.task)
    return dag


for pipeline in pipeline_configs():
    backfill_dag(pipeline)
