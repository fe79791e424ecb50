"""Integration tests run against the real local stack (scripts/stack up): one broker, one
Postgres, and one SparkSession per test session. Unit tests need none of it."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers import ROOT, TEST_DB_URL

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")


def pytest_collection_modifyitems(items):
    for item in items:
        if any(f"/{d}/" in str(item.fspath) for d in ("integration", "airflow", "security")):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(scope="session")
def stack():
    """Brings the stack up (idempotent; fast when it is up already)."""
    subprocess.run([str(ROOT / "scripts" / "stack"), "up"], check=True)
    return {"bootstrap": os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"),
            "db_url": TEST_DB_URL}


@pytest.fixture(scope="session")
def spark(stack):
    from pipeline.spark import get_spark

    session = get_spark("local[2]")
    yield session
    session.stop()
