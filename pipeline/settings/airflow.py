"""[airflow]: read by airflow_dags/ (the DAGs' schedule, retries, owner, tags, pool, queue and
the connections), not by the job; checked here so that a mistake fails like any other.

This model is the one description of the table: the DAGs check each config's [airflow]
table, and their PIPELINE_* defaults, with ``airflow_table`` when they are parsed
(airflow_dags/pipeline_airflow/job_package.py reaches this package)."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, Field, ValidationError

from pipeline.settings.base import NonEmpty, Table, about_key
from pipeline.settings.messages import config_error


def _tags(value: list) -> list:
    if not all(isinstance(t, str) and t.strip() for t in value):
        raise about_key("must be a list of non-empty strings")
    return value


# The longest delay or timeout taken (a year): Airflow keeps them as timedelta, which a
# value like 1e300 overflows, failing the DAG's parsing instead of naming the key.
A_YEAR = 366 * 86400


class AirflowTable(Table):
    schedule: NonEmpty | None = None
    retries: int | None = Field(None, ge=0, le=1000)
    retry_delay_seconds: float | None = Field(None, ge=0, le=A_YEAR)
    max_retry_delay_seconds: float | None = Field(None, ge=1, le=A_YEAR)
    execution_timeout_seconds: float | None = Field(None, ge=1, le=A_YEAR)
    owner: NonEmpty | None = None
    tags: Annotated[list, AfterValidator(_tags)] | None = None
    pool: NonEmpty | None = None
    pool_slots: int | None = Field(None, ge=1)
    queue: NonEmpty | None = None
    spark_conn_id: NonEmpty | None = None
    postgres_conn_id: NonEmpty | None = None
    kafka_conn_id: NonEmpty | None = None


class _AirflowOnly(Table):
    """A config holding only [airflow]: its errors name the keys as the job's do."""
    airflow: AirflowTable = AirflowTable()


def airflow_table(table: Any, *, strict: bool = True) -> AirflowTable:
    """``table`` as the job checks a config's [airflow] table: ConfigError with the job's one
    line ("'airflow.retries' must be >= 0, got -1") if it has a mistake. ``strict=False``
    takes values given as text, as the DAGs' PIPELINE_* defaults are ("5" is 5)."""
    try:
        return _AirflowOnly.model_validate({"airflow": table}, strict=strict).airflow
    except ValidationError as e:
        raise config_error(e, _AirflowOnly) from None
