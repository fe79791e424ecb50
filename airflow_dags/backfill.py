"""
### <pipeline>.backfill: re-read an explicit range of one topic (manual)

One such DAG per config file in `PIPELINE_CONFIG_DIR`, named after its pipeline. Trigger
with parameters; they are checked twice before anything is submitted: by their
JSON schema when the run is created, then by `validate_params`, which fails at once
(no retry) with a message saying what to change. Only then is
`pipeline/submit.py backfill --config <that config> --topic T [--partition P ...]
(--from-offset A --to-offset B | --from-time ISO --to-time ISO) [--reprocess] --json`
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
ingestion holds the pipeline's lock), everything else fails at once.
"""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from _common import (
    PipelineConfig,
    PipelineSubmitOperator,
    connection_ids,
    dag_settings,
    pipeline_configs,
)
from airflow.sdk import DAG, Param, task
from airflow.sdk.exceptions import AirflowFailException

OFFSET = {"type": ["null", "integer"], "minimum": 0}
TIME = {"type": ["null", "string"], "format": "date-time"}
OTHER_END = {"from_offset": "to_offset", "to_offset": "from_offset",
             "from_time": "to_time", "to_time": "from_time"}


def invalid(reason: str) -> AirflowFailException:
    return AirflowFailException(f"invalid backfill params: {reason}")


def instant(params: dict[str, Any], key: str) -> datetime:
    """As the CLI reads it: ISO 8601, a time without a zone is UTC."""
    try:
        parsed = datetime.fromisoformat(params[key])
    except ValueError:
        raise invalid(f"{key} = {params[key]!r} is not an ISO 8601 time, e.g. "
                      "2025-01-31T00:00:00Z") from None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def backfill_args(config: Path, params: dict[str, Any]) -> list[str]:
    """The job's arguments, after the checks JSON schema cannot express (one range kind,
    both ends, from before to, the config on this worker); AirflowFailException if not."""
    if not config.is_file():
        raise invalid(f"config file {config} not found on this worker")
    offsets = [k for k in ("from_offset", "to_offset") if params[k] is not None]
    times = [k for k in ("from_time", "to_time") if params[k]]
    if offsets and times:
        raise invalid(f"give offsets or times, not both (got {', '.join(offsets + times)})")
    if not offsets and not times:
        raise invalid("give a range: from_offset and to_offset, or from_time and to_time")
    if len(offsets + times) == 1:
        given = (offsets + times)[0]
        raise invalid(f"{given} is set but {OTHER_END[given]} is not; give both ends")
    args = ["backfill", "--config", str(config), "--topic", params["topic"]]
    for p in params["partitions"]:
        args += ["--partition", str(p)]
    if offsets:
        if params["from_offset"] >= params["to_offset"]:
            raise invalid(f"from_offset {params['from_offset']} must be below to_offset "
                          f"{params['to_offset']} (the range is [from, to))")
        args += ["--from-offset", str(params["from_offset"]),
                 "--to-offset", str(params["to_offset"])]
    else:
        if instant(params, "from_time") >= instant(params, "to_time"):
            raise invalid(f"from_time {params['from_time']} must be before to_time "
                          f"{params['to_time']} (the range is [from, to))")
        args += ["--from-time", params["from_time"], "--to-time", params["to_time"]]
    if params["reprocess"]:
        args.append("--reprocess")
    return [*args, "--json"]


def backfill_dag(pipeline: PipelineConfig) -> DAG:
    name, config = pipeline.name, pipeline.path
    with DAG(
        dag_id=f"{name}.backfill",
        description=f"{name}: re-read an explicit Kafka offset or time range into Postgres "
        "(idempotent)",
        schedule=None,
        **dag_settings(name, pipeline.airflow),
        params={
            "topic": Param(type="string", pattern=r"^[A-Za-z0-9._-]{1,249}$",
                           description="Topic to re-read (required)"),
            "partitions": Param([], type="array", items={"type": "integer", "minimum": 0},
                                uniqueItems=True, description="Partitions; empty = all"),
            "from_offset": Param(None, **OFFSET, description="First offset to read"),
            "to_offset": Param(None, **OFFSET, description="Offset to stop before (exclusive)"),
            "from_time": Param(None, **TIME, description="Or: from this time (no zone = UTC)"),
            "to_time": Param(None, **TIME, description="Or: stop before this time (exclusive)"),
            "reprocess": Param(False, type="boolean",
                               description="Overwrite existing rows instead of keeping them"),
        },
        doc_md=__doc__,
    ) as dag:

        @task(retries=0)
        def validate_params(params=None) -> list[str]:
            """Fails at once, with the reason, on params the job would refuse."""
            return backfill_args(config, params)

        PipelineSubmitOperator(task_id="backfill", application_args=validate_params(),
                               config=config, **connection_ids(pipeline.airflow))
    return dag


for pipeline in pipeline_configs():
    backfill_dag(pipeline)
