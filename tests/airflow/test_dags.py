"""The DAG files parse like the dag processor parses them, and carry the settings we rely
on: schedule, no catch-up, one run at a time, retries with backoff, the job's wiring."""

from __future__ import annotations

import pytest

from tests.airflow.conftest import DAGS_FOLDER
from tests.helpers import ROOT

pytestmark = pytest.mark.airflow

JOB_VENV = ROOT / ".venv"
SUBMITTER = ["PipelineSubmitOperator", "SparkSubmitOperator"]


@pytest.fixture(scope="module")
def bag(airflow):
    result, _ = airflow.run("check")
    return result


def test_dag_files_import_without_errors(bag):
    assert bag["import_errors"] == {}
    assert set(bag["dags"]) == {"pipeline_ingest", "pipeline_backfill"}
    assert {d["fileloc"] for d in bag["dags"].values()} == {
        str(DAGS_FOLDER / "ingest.py"), str(DAGS_FOLDER / "backfill.py")}


def check_submit_task(t: dict) -> None:
    """The wiring both DAGs share: the job venv's spark-submit of pipeline/submit.py with the
    connector jars, its python for the driver and workers, retries with backoff."""
    assert t["mro"][:2] == SUBMITTER
    assert t["application"] == str(ROOT / "pipeline" / "submit.py")
    assert t["_spark_binary"] == str(JOB_VENV / "bin" / "spark-submit")
    assert t["_conn_id"] == "spark_local"
    jars = t["jars"].split(",")
    assert jars == sorted(str(p) for p in (ROOT / ".jars" / "spark").glob("*.jar"))
    assert any("spark-sql-kafka-0-10" in j for j in jars)
    assert t["env_vars"]["PYSPARK_PYTHON"] == str(JOB_VENV / "bin" / "python")
    assert t["env_vars"]["PYSPARK_DRIVER_PYTHON"] == str(JOB_VENV / "bin" / "python")
    assert t["env_vars"]["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert t["retries"] == 3
    assert t["retry_delay"] == 60
    assert t["retry_exponential_backoff"] == 2.0
    assert t["max_retry_delay"] == 900


def test_ingest_dag_settings(bag):
    dag = bag["dags"]["pipeline_ingest"]
    assert dag["schedule"] == "*/5 * * * *"
    assert dag["catchup"] is False
    assert dag["max_active_runs"] == 1
    assert "Exit codes" in dag["doc_md"] and "`75`" in dag["doc_md"]
    assert dag["params"]["config"]["default"] == str(ROOT / "conf" / "local.toml")
    assert list(dag["tasks"]) == ["ingest"]
    t = dag["tasks"]["ingest"]
    check_submit_task(t)
    assert t["application_args"] == ["run", "--config", "{{ params.config }}", "--json"]


def test_backfill_dag_settings(bag):
    dag = bag["dags"]["pipeline_backfill"]
    assert dag["schedule"] is None
    assert dag["max_active_runs"] == 1
    assert "validate_params" in dag["doc_md"]
    params = dag["params"]
    assert set(params) == {"config", "topic", "partitions", "from_offset", "to_offset",
                           "from_time", "to_time", "reprocess"}
    assert params["topic"]["default"] is None  # required: no default to fall back on
    assert params["partitions"]["schema"]["items"] == {"type": "integer", "minimum": 0}
    assert params["from_offset"]["schema"]["minimum"] == 0
    assert params["reprocess"]["default"] is False
    validate, submit = dag["tasks"]["validate_params"], dag["tasks"]["backfill"]
    assert validate["retries"] == 0
    assert submit["upstream"] == ["validate_params"]
    check_submit_task(submit)


def test_settings_come_from_the_environment(airflow):
    result, _ = airflow.run("check", env={
        "PIPELINE_SCHEDULE": "0 * * * *", "PIPELINE_CONFIG": "/etc/pipeline/prod.toml",
        "PIPELINE_RETRIES": "5", "PIPELINE_RETRY_DELAY_SECONDS": "30"})
    assert result["import_errors"] == {}
    ingest = result["dags"]["pipeline_ingest"]
    assert ingest["schedule"] == "0 * * * *"
    assert ingest["params"]["config"]["default"] == "/etc/pipeline/prod.toml"
    assert ingest["tasks"]["ingest"]["retries"] == 5
    assert ingest["tasks"]["ingest"]["retry_delay"] == 30
    backfill = result["dags"]["pipeline_backfill"]
    assert backfill["params"]["config"]["default"] == "/etc/pipeline/prod.toml"
    assert backfill["tasks"]["backfill"]["retries"] == 5
