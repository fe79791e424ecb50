"""The DAG files parse like the dag processor parses them - one ingest and one backfill DAG
per pipeline config in PIPELINE_CONFIG_DIR - and carry the settings we rely on: schedule,
no catch-up, one run at a time, retries with backoff, the job's wiring, and what a
pipeline's [airflow] table changes. Parsing needs only the config folder, not the job's
files on the worker. The spark-submit command is built from the Spark connection."""

from __future__ import annotations

import json

import pytest

from tests.airflow.conftest import DAGS_FOLDER, dag_env
from tests.helpers import ROOT, toml_config

pytestmark = pytest.mark.airflow

JOB_VENV = ROOT / ".venv"
SUBMITTER = ["PipelineSubmitOperator", "BaseOperator"]


PIPELINES = ("alpha_orders", "beta_orders")


@pytest.fixture(scope="module")
def config_dir(tmp_path_factory):
    """Two pipeline configs; the file names differ from the pipeline names on purpose."""
    folder = tmp_path_factory.mktemp("configs")
    for i, name in enumerate(PIPELINES):
        (folder / f"pipeline{i}.toml").write_text(toml_config(name, [name]))
    return folder


@pytest.fixture(scope="module")
def bag(airflow, config_dir):
    result, _ = airflow.run("check", env=dag_env(config_dir))
    return result


def test_one_ingest_and_one_backfill_dag_per_pipeline_config(bag, config_dir):
    assert bag["import_errors"] == {}
    assert set(bag["dags"]) == {f"{n}.{kind}" for n in PIPELINES
                                for kind in ("ingest", "backfill")}
    for name in PIPELINES:
        assert bag["dags"][f"{name}.ingest"]["fileloc"] == str(DAGS_FOLDER / "ingest.py")
        assert bag["dags"][f"{name}.backfill"]["fileloc"] == str(DAGS_FOLDER / "backfill.py")
    # Each DAG runs the job with its own config file.
    assert bag["dags"]["beta_orders.ingest"]["tasks"]["ingest"]["application_args"] == [
        "run", "--config", str(config_dir / "pipeline1.toml"), "--json"]


def check_submit_task(t: dict) -> None:
    """The wiring both DAGs share: our own operator on Airflow's public API (nothing of the
    Spark provider), the job venv's spark-submit of pipeline/submit.py, the default Spark
    connection, no credentials connection, retries with backoff."""
    assert t["mro"][:2] == SUBMITTER
    assert not [m for m in t["modules"] if m.startswith("airflow.providers")]
    assert t["application"] == str(ROOT / "pipeline" / "submit.py")
    assert t["spark_submit"] == str(JOB_VENV / "bin" / "spark-submit")
    assert t["spark_conn_id"] == "spark_local"
    assert (t["postgres_conn_id"], t["kafka_conn_id"]) == (None, None)
    assert t["owner"] == "data-engineering"
    assert t["execution_timeout"] == 7200
    assert t["retries"] == 3
    assert t["retry_delay"] == 60
    assert t["retry_exponential_backoff"] == 2.0
    assert t["max_retry_delay"] == 900


def test_ingest_dag_settings(bag, config_dir):
    dag = bag["dags"]["alpha_orders.ingest"]
    assert dag["schedule"] == "*/5 * * * *"
    assert dag["catchup"] is False
    assert dag["max_active_runs"] == 1
    assert dag["tags"] == sorted(["pipeline", "kafka", "spark", "alpha_orders"])
    assert "Exit codes" in dag["doc_md"] and "`75`" in dag["doc_md"]
    assert dag["params"] == {}
    assert list(dag["tasks"]) == ["ingest"]
    t = dag["tasks"]["ingest"]
    check_submit_task(t)
    assert t["application_args"] == [
        "run", "--config", str(config_dir / "pipeline0.toml"), "--json"]


def test_backfill_dag_settings(bag):
    dag = bag["dags"]["alpha_orders.backfill"]
    assert dag["schedule"] is None
    assert dag["max_active_runs"] == 1
    assert "validate_params" in dag["doc_md"]
    params = dag["params"]
    assert set(params) == {"topic", "partitions", "from_offset", "to_offset",
                           "from_time", "to_time", "reprocess"}
    assert params["topic"]["default"] is None  # required: no default to fall back on
    assert params["partitions"]["schema"]["items"] == {"type": "integer", "minimum": 0}
    assert params["from_offset"]["schema"]["minimum"] == 0
    assert params["reprocess"]["default"] is False
    validate, submit = dag["tasks"]["validate_params"], dag["tasks"]["backfill"]
    assert validate["retries"] == 0
    assert submit["upstream"] == ["validate_params"]
    check_submit_task(submit)


def test_settings_come_from_the_environment(airflow, config_dir):
    result, _ = airflow.run("check", env=dag_env(
        config_dir, PIPELINE_SCHEDULE="0 * * * *", PIPELINE_RETRIES="5",
        PIPELINE_RETRY_DELAY_SECONDS="30"))
    assert result["import_errors"] == {}
    ingest = result["dags"]["alpha_orders.ingest"]
    assert ingest["schedule"] == "0 * * * *"
    assert ingest["tasks"]["ingest"]["retries"] == 5
    assert ingest["tasks"]["ingest"]["retry_delay"] == 30
    backfill = result["dags"]["beta_orders.backfill"]
    assert backfill["tasks"]["backfill"]["retries"] == 5


def test_parsing_does_not_need_the_jobs_files(airflow, config_dir, tmp_path):
    """A dag-processor without the job venv, the jars or the repository still parses every
    pipeline's DAGs: those are the worker's business, checked when a task runs."""
    nowhere = tmp_path / "nowhere"
    result, _ = airflow.run("check", env=dag_env(
        config_dir, PIPELINE_HOME=str(nowhere), PIPELINE_VENV=str(nowhere / "venv"),
        PIPELINE_JARS_DIR=str(nowhere / "jars")))
    assert result["import_errors"] == {}
    assert len(result["dags"]) == 4


def test_config_folder_mistakes(airflow, tmp_path):
    """An unreadable config still gets its DAGs, named after the file, so its runs fail with
    the job's own config error instead of the pipeline silently vanishing; two configs
    naming one pipeline (they would share its offsets) are a parse error naming both."""
    (tmp_path / "good.toml").write_text(toml_config("good_one", ["orders"]))
    (tmp_path / "broken.toml").write_text("[pipeline\nname = ")
    result, _ = airflow.run("check", env=dag_env(tmp_path))
    assert result["import_errors"] == {}
    assert set(result["dags"]) == {"good_one.ingest", "good_one.backfill",
                                   "broken.ingest", "broken.backfill"}
    assert result["dags"]["broken.ingest"]["tasks"]["ingest"]["application_args"][2] == str(
        tmp_path / "broken.toml")

    (tmp_path / "copy.toml").write_text(toml_config("good_one", ["orders"]))
    result, _ = airflow.run("check", env=dag_env(tmp_path))
    errors = " ".join(result["import_errors"].values())
    assert "both name the pipeline 'good_one'" in errors
    assert str(tmp_path / "copy.toml") in errors and str(tmp_path / "good.toml") in errors


AIRFLOW_TABLE = """
[airflow]
schedule = "@hourly"
retries = 7
retry_delay_seconds = 5
max_retry_delay_seconds = 120
execution_timeout_seconds = 600
owner = "payments"
tags = ["orders", "tier-1"]
pool = "spark_pool"
pool_slots = 2
queue = "spark_workers"
spark_conn_id = "spark_yarn"
postgres_conn_id = "orders_db"
kafka_conn_id = "orders_kafka"
"""


def test_an_airflow_table_sets_its_pipelines_dags_and_the_environment_the_rest(
        airflow, tmp_path):
    (tmp_path / "tuned.toml").write_text(toml_config("tuned", ["orders"]) + AIRFLOW_TABLE)
    (tmp_path / "plain.toml").write_text(toml_config("plain", ["orders"]))
    result, _ = airflow.run("check", env=dag_env(tmp_path, PIPELINE_RETRIES="4"))
    assert result["import_errors"] == {}
    ingest = result["dags"]["tuned.ingest"]
    assert ingest["schedule"] == "@hourly"
    assert ingest["tags"] == sorted(["pipeline", "kafka", "spark", "tuned", "orders",
                                     "tier-1"])
    for t in (ingest["tasks"]["ingest"], result["dags"]["tuned.backfill"]["tasks"]["backfill"]):
        assert (t["retries"], t["retry_delay"], t["max_retry_delay"]) == (7, 5, 120)
        assert (t["execution_timeout"], t["owner"]) == (600, "payments")
        assert (t["pool"], t["pool_slots"], t["queue"]) == ("spark_pool", 2, "spark_workers")
        assert (t["spark_conn_id"], t["postgres_conn_id"], t["kafka_conn_id"]) == (
            "spark_yarn", "orders_db", "orders_kafka")
    plain = result["dags"]["plain.ingest"]
    assert plain["schedule"] == "*/5 * * * *"
    assert plain["tasks"]["ingest"]["retries"] == 4
    assert plain["tasks"]["ingest"]["spark_conn_id"] == "spark_local"


def test_a_mistake_in_the_airflow_table_keeps_the_dags_on_the_defaults(airflow, tmp_path):
    """The job refuses such a config (exit 2, naming the key): the DAGs stay visible, so
    its runs fail with that message rather than the pipeline vanishing from the UI."""
    (tmp_path / "typo.toml").write_text(
        toml_config("typo", ["orders"]) + '[airflow]\nretries = "many"\nowner = "x"\n')
    result, _ = airflow.run("check", env=dag_env(tmp_path))
    assert result["import_errors"] == {}
    t = result["dags"]["typo.ingest"]["tasks"]["ingest"]
    assert (t["retries"], t["owner"]) == (3, "data-engineering")


def connection(conn_id: str, **fields) -> dict[str, str]:
    return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(fields)}


def test_the_command_line_comes_from_the_spark_connection(airflow, config_dir):
    env = dag_env(config_dir, PIPELINE_SPARK_CONN_ID="spark_yarn", **connection(
        "spark_yarn", conn_type="spark", host="yarn",
        extra={"deploy-mode": "client", "queue": "etl"}))
    result, _ = airflow.run("command", "alpha_orders.ingest", "ingest", env=env)
    spark_submit = str(JOB_VENV / "bin" / "spark-submit")
    assert result["command"] == [
        spark_submit, "--master", "yarn", "--deploy-mode", "client", "--queue", "etl",
        "--conf", "spark.log.level=WARN", "--jars", result["command"][10],
        "--name", "{{ dag.dag_id }}", str(ROOT / "pipeline" / "submit.py"),
        "run", "--config", str(config_dir / "pipeline0.toml"), "--json"]
    assert "spark-sql-kafka" in result["command"][10]  # this worker has the connector jars
    assert result["job_env"]["PYSPARK_PYTHON"] == str(JOB_VENV / "bin" / "python")
    assert result["job_env"]["PYSPARK_DRIVER_PYTHON"] == str(JOB_VENV / "bin" / "python")
    assert result["job_env"]["SPARK_LOCAL_IP"] == "127.0.0.1"

    # A standalone master with its port apart, as the UI's form stores it: the executors
    # run elsewhere, so the packed environment is shipped and their Python comes from it.
    archive = config_dir / "env.tar.gz"
    archive.write_bytes(b"")
    env = dag_env(config_dir, PIPELINE_ARCHIVE=str(archive), PIPELINE_JARS_DIR="/nowhere",
                  **connection("spark_local", conn_type="spark", host="spark://10.0.0.5",
                               port=7077))
    result, _ = airflow.run("command", "alpha_orders.ingest", "ingest", env=env)
    assert result["command"][1:] == [
        "--master", "spark://10.0.0.5:7077",
        "--conf", "spark.pyspark.python=./job/bin/python",
        "--conf", f"spark.pyspark.driver.python={JOB_VENV}/bin/python",
        "--conf", "spark.log.level=WARN", "--archives", f"{archive}#job",
        "--name", "{{ dag.dag_id }}", str(ROOT / "pipeline" / "submit.py"),
        "run", "--config", str(config_dir / "pipeline0.toml"), "--json"]
