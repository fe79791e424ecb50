"""[airflow]: read by airflow_dags/ (the DAGs' schedule, retries, owner, tags, pool, queue and
the connections), not by the job; checked here so that a mistake fails like any other."""

from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field

from pipeline.settings.base import NonEmpty, Table, about_key


def _tags(value: list) -> list:
    if not all(isinstance(t, str) and t.strip() for t in value):
        raise about_key("must be a list of non-empty strings")
    return value


class AirflowTable(Table):
    schedule: NonEmpty | None = None
    retries: int | None = Field(None, ge=0)
    retry_delay_seconds: float | None = Field(None, ge=0)
    max_retry_delay_seconds: float | None = Field(None, ge=1)
    execution_timeout_seconds: float | None = Field(None, ge=1)
    owner: NonEmpty | None = None
    tags: Annotated[list, AfterValidator(_tags)] | None = None
    pool: NonEmpty | None = None
    pool_slots: int | None = Field(None, ge=1)
    queue: NonEmpty | None = None
    spark_conn_id: NonEmpty | None = None
    postgres_conn_id: NonEmpty | None = None
    kafka_conn_id: NonEmpty | None = None
