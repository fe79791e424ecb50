"""What a pipeline's DAGs are built with: each setting from the config's [airflow] table
(checked by the job's model, configs.py), else its default from the environment (checked
by the same model), else ours:

  [airflow] key              environment                        ours
  schedule (ingest only)     PIPELINE_SCHEDULE                  */5 * * * *
  retries                    PIPELINE_RETRIES                   3
  retry_delay_seconds        PIPELINE_RETRY_DELAY_SECONDS       60 (doubling each retry)
  max_retry_delay_seconds    PIPELINE_MAX_RETRY_DELAY_SECONDS   900
  execution_timeout_seconds  PIPELINE_TASK_TIMEOUT_SECONDS      7200
  owner                      PIPELINE_OWNER                     data-engineering
  spark_conn_id              PIPELINE_SPARK_CONN_ID             spark_local
  tags, pool, pool_slots, queue, postgres_conn_id, kafka_conn_id: the table only

A value that cannot be used (a schedule Airflow refuses, "PIPELINE_RETRIES=many") is a
problem of the DAG it concerns: that DAG is built with our default instead and its task
fails at run time with the problem and its fix (operator.py). The other DAGs, and the
pipeline's other DAG when the problem is not its own, are untouched.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from pipeline_airflow import job_package
from pipeline_airflow.configs import PipelineConfig

log = logging.getLogger(__name__)

DEFAULT_SCHEDULE = "*/5 * * * *"
# [airflow] key -> (the environment variable of its default, our default)
DEFAULTS: dict[str, tuple[str | None, Any]] = {
    "schedule": ("PIPELINE_SCHEDULE", DEFAULT_SCHEDULE),
    "retries": ("PIPELINE_RETRIES", 3),
    "retry_delay_seconds": ("PIPELINE_RETRY_DELAY_SECONDS", 60),
    "max_retry_delay_seconds": ("PIPELINE_MAX_RETRY_DELAY_SECONDS", 900),
    "execution_timeout_seconds": ("PIPELINE_TASK_TIMEOUT_SECONDS", 7200),
    "owner": ("PIPELINE_OWNER", "data-engineering"),
    "spark_conn_id": ("PIPELINE_SPARK_CONN_ID", "spark_local"),
    "tags": (None, []),
    "pool": (None, None),
    "pool_slots": (None, None),
    "queue": (None, None),
    "postgres_conn_id": (None, None),
    "kafka_conn_id": (None, None),
}
# What every pipeline's DAGs share: no catch-up, one run at a time (the job holds the
# pipeline's lock anyway).
START_DATE = datetime(2025, 1, 1, tzinfo=UTC)
BASE_TAGS = ["pipeline", "kafka", "spark"]


@dataclass(frozen=True)
class DagSettings:
    dag: dict[str, Any]  # DAG(...) arguments: schedule, tags, default_args, ...
    task: dict[str, Any]  # PipelineSubmitOperator(...) arguments: connections, problems


def dag_settings(pipeline: PipelineConfig, *, scheduled: bool,
                 environ: Mapping[str, str] | None = None) -> DagSettings:
    """The settings of the pipeline's ingest DAG (``scheduled``) or backfill DAG."""
    environ = os.environ if environ is None else environ
    problems = list(pipeline.problems)

    def value(key: str) -> Any:
        return setting(key, pipeline.airflow, environ, problems)

    def seconds(key: str) -> timedelta:
        given = value(key)
        try:
            return timedelta(seconds=given)
        except OverflowError:
            source = (f"[airflow] {key} = {given} of {pipeline.path}" if key in pipeline.airflow
                      else f"{DEFAULTS[key][0]}={given}")
            problems.append(f"{source} seconds is more than Airflow can wait: use a smaller "
                            "value")
            return timedelta(seconds=DEFAULTS[key][1])

    for key in pipeline.airflow.keys() - DEFAULTS.keys():
        problems.append(f"the DAGs do not apply [airflow] {key} of {pipeline.path}, which "
                        "the job's model has: update airflow_dags/ with the job")

    default_args = {
        "owner": value("owner"),
        "retries": value("retries"),
        "retry_delay": seconds("retry_delay_seconds"),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": seconds("max_retry_delay_seconds"),
        "execution_timeout": seconds("execution_timeout_seconds"),
    }
    for key in ("pool", "pool_slots", "queue"):
        if value(key) is not None:
            default_args[key] = value(key)
    tags = [*BASE_TAGS, pipeline.name]
    tags += [t for t in value("tags") if t not in tags]
    dag = {"schedule": schedule(value("schedule"), pipeline, problems) if scheduled else None,
           "start_date": START_DATE, "catchup": False, "max_active_runs": 1,
           "default_args": default_args, "tags": tags}
    task = {"spark_conn_id": value("spark_conn_id"),
            "postgres_conn_id": value("postgres_conn_id"),
            "kafka_conn_id": value("kafka_conn_id"),
            "config_problems": tuple(dict.fromkeys(problems))}
    return DagSettings(dag, task)


def setting(key: str, table: Mapping[str, Any], environ: Mapping[str, str],
            problems: list[str]) -> Any:
    """One setting: the table's, else the environment's (checked by the job's model, a
    refused value a problem), else ours."""
    if key in table:
        return table[key]
    variable, default = DEFAULTS[key]
    text = environ.get(variable) if variable else None
    if not text:
        return default
    try:
        return job_package.airflow_value(key, text)
    except job_package.AirflowTableError as e:
        problems.append(f"{variable}={text!r} is not a valid [airflow] {key} ({e}): fix it "
                        "where the dag-processor and the workers get their environment")
    except job_package.JobPackageUnavailable as e:
        problems.append(f"{variable}={text!r} cannot be checked: {e}")
    return default


def schedule(text: str, pipeline: PipelineConfig, problems: list[str]) -> str | None:
    """The ingest DAG's schedule: a cron expression or preset Airflow accepts, or "none"
    (only when triggered); one Airflow refuses is a problem, and our default is used."""
    if text.lower() == "none":
        return None
    refused = refusal(text)
    if refused:
        source = (f"[airflow] schedule = {text!r} of {pipeline.path}"
                  if "schedule" in pipeline.airflow else f"PIPELINE_SCHEDULE={text!r}")
        problems.append(f"{source} is not a schedule Airflow accepts ({refused}): write a "
                        "cron expression (\"*/5 * * * *\"), a preset (\"@hourly\", "
                        "\"@continuous\") or \"none\"")
        return DEFAULT_SCHEDULE
    return text


def refusal(schedule: str) -> str | None:
    """Why Airflow would refuse ``schedule`` (None: it takes it), asked of the timetable it
    would build, as the dag-processor does when it validates a DAG."""
    from airflow.sdk import CronTriggerTimetable

    if schedule in ("@once", "@continuous"):
        return None
    try:
        CronTriggerTimetable(schedule, timezone="UTC").validate()
    except Exception as e:  # whatever Airflow raises, it refuses the schedule
        return str(e) or type(e).__name__
    return None
