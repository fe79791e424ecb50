"""Integration tests run against the real local stack (scripts/stack up): one broker, one
Postgres, and one SparkSession per test session. Unit tests need none of it."""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.helpers import BOOTSTRAP, ROOT, TEST_DB_URL, product_env

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# No test depends on its caller's environment: the variables the job reads as settings
# (PIPELINE__*, and the old names it warns about) are gone for the whole session, after
# tests/helpers.py took where the test broker and database are. A test that means to set
# one does so itself (monkeypatch, or run_cli's env).
for _name in [n for n in os.environ if product_env(n)]:
    del os.environ[_name]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "spark_line: also run on the second Spark line (3.5): scripts/test runs "
        "these again with .venv-spark35 after the whole suite on the default line")


def pytest_collection_modifyitems(items):
    for item in items:
        if any(f"/{d}/" in str(item.fspath) for d in ("integration", "airflow", "security", "cdc")):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _no_class_archive_dump_in_process(request, monkeypatch):
    """An in-process run of an integration test never claims the driver JVM's class
    archive (spark/class_archive.py); it maps one that exists. Its dumping process would
    start only as pytest exits, and the claim would keep the suite's CLI runs from
    writing one meanwhile. CLI runs (subprocesses) do as a user's do: the first one's
    exit starts the process that writes it, the later ones map it."""
    if request.node.get_closest_marker("integration"):
        from pipeline.spark import class_archive

        monkeypatch.setattr(class_archive, "claim", lambda marker, now: False)


@pytest.fixture(scope="session")
def stack():
    """Brings the stack up (idempotent; fast when it is up already)."""
    subprocess.run([str(ROOT / "scripts" / "stack"), "up"], check=True)
    return {"bootstrap": BOOTSTRAP, "db_url": TEST_DB_URL}


@pytest.fixture(scope="session")
def registry() -> str:
    """The stack's Schema Registry (scripts/registry up: idempotent, fetches Apicurio once);
    its Confluent-compatible API's URL."""
    subprocess.run([str(ROOT / "scripts" / "registry"), "up"], check=True)
    return f"http://127.0.0.1:{os.environ.get('REGISTRY_PORT', '8381')}/apis/ccompat/v7"


@pytest.fixture(scope="session")
def spark(stack):
    """The test session's one Spark, started as a run starts it (spark/session.py), with
    Spark SQL on it; an in-process run before this fixture shares its JVM."""
    from pyspark.sql import SparkSession

    from pipeline.spark.session import get_context

    get_context("local[2]")
    session = SparkSession.builder.getOrCreate()
    yield session
    session.stop()


@pytest.fixture(scope="session")
def spark_line_version() -> str:
    """The pyspark version this pass must run on: scripts/test says which line it started
    (PIPELINE_TEST_SPARK_VERSION, the line's pin); plain pytest means the default line."""
    if os.environ.get("PIPELINE_TEST_SPARK_VERSION"):
        return os.environ["PIPELINE_TEST_SPARK_VERSION"]
    pins = (ROOT / "constraints" / "spark-4.0.txt").read_text().splitlines()
    return next(line.split("==")[1] for line in pins if line.startswith("pyspark=="))
