"""The DAG files parse like the dag processor parses them - one ingest and one backfill DAG
per pipeline config in PIPELINE_CONFIG_DIR - and carry the settings we rely on: schedule,
no catch-up, one run at a time, retries with backoff, the job's wiring, and what a
pipeline's [airflow] table changes. Parsing needs only the config folder, not the job's
files on the worker. A mistake in one config or in one PIPELINE_* setting fails only the
DAGs it concerns, at run time, naming the fix: every other DAG still parses. The
spark-submit command is built from the Spark connection."""

from __future__ import annotations

import json
import tomllib

import pytest

from pipeline.settings.airflow import AirflowTable
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
        "run", "--config", str(config_dir / "pipeline1.toml")]


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
    assert t["config_problems"] == []


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
        "run", "--config", str(config_dir / "pipeline0.toml")]


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


def problems(result: dict, dag_id: str) -> list[str]:
    """What fails the runs of a DAG's submitting task until it is fixed."""
    [submit] = [t for t in result["dags"][dag_id]["tasks"].values()
                if "PipelineSubmitOperator" in t["mro"]]
    return submit["config_problems"]


def test_parsing_does_not_need_the_jobs_files(airflow, config_dir, tmp_path):
    """A dag-processor without the job venv or the repository still parses every
    pipeline's DAGs: those are the worker's business, checked when a task runs. Only a
    config with an [airflow] table needs the job's package (its model checks the table):
    without it, that pipeline's runs fail naming PIPELINE_HOME, and no other's."""
    nowhere = tmp_path / "nowhere"
    for path in config_dir.glob("*.toml"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "tuned.toml").write_text(
        toml_config("tuned", ["orders"]) + '[airflow]\nschedule = "@hourly"\n')
    result, _ = airflow.run("check", env=dag_env(
        tmp_path, PIPELINE_HOME=str(nowhere), PIPELINE_VENV=str(nowhere / "venv")))
    assert result["import_errors"] == {}
    assert len(result["dags"]) == 6
    for name in PIPELINES:
        assert problems(result, f"{name}.ingest") == []
    [problem] = problems(result, "tuned.ingest")
    assert f"PIPELINE_HOME={nowhere}" in problem and str(tmp_path / "tuned.toml") in problem


def test_a_config_with_a_mistake_fails_only_its_own_dags(airflow, tmp_path):
    """Each mistake stays with its config: its DAGs are still there (named after the file
    when the name cannot be used), on the defaults, and their runs fail saying what to
    fix; the other pipelines' DAGs parse as if nothing happened. Two configs naming one
    pipeline (they would share its offsets) are a problem of both, naming both."""
    (tmp_path / "good.toml").write_text(toml_config("good_one", ["orders"]))
    (tmp_path / "other.toml").write_text(toml_config("other_one", ["orders"]))
    (tmp_path / "copy.toml").write_text(toml_config("other_one", ["orders"]))
    (tmp_path / "broken.toml").write_text("[pipeline\nname = ")
    (tmp_path / "typo.toml").write_text(
        toml_config("typo", ["orders"]) + '[airflow]\nretries = "many"\nowner = "x"\n')
    (tmp_path / "cron.toml").write_text(
        toml_config("cron", ["orders"]) + '[airflow]\nschedule = "every 5 minutes"\n')
    (tmp_path / "forever.toml").write_text(
        toml_config("forever", ["orders"]) + "[airflow]\nexecution_timeout_seconds = 1e300\n")
    result, _ = airflow.run("check", env=dag_env(tmp_path))

    assert result["import_errors"] == {}
    assert set(result["dags"]) == {f"{name}.{kind}" for kind in ("ingest", "backfill")
                                   for name in ("good_one", "other", "copy", "broken", "typo",
                                                "cron", "forever")}
    for kind in ("ingest", "backfill"):
        assert problems(result, f"good_one.{kind}") == []
        [unreadable] = problems(result, f"broken.{kind}")
        assert str(tmp_path / "broken.toml") in unreadable and "cannot be read" in unreadable
        for name in ("other", "copy"):
            [twice] = problems(result, f"{name}.{kind}")
            assert "all name the pipeline 'other_one'" in twice
            assert str(tmp_path / "copy.toml") in twice and str(tmp_path / "other.toml") in twice
        # The job's own line for the key, and the table's other keys left on the defaults.
        [typo] = problems(result, f"typo.{kind}")
        assert "'airflow.retries' must be an integer, got str 'many'" in typo
        t = result["dags"][f"typo.{kind}"]["tasks"][kind]
        assert (t["retries"], t["owner"]) == (3, "data-engineering")
        [forever] = problems(result, f"forever.{kind}")
        assert "'airflow.execution_timeout_seconds' must be <= 31622400, got 1e+300" in forever
    assert result["dags"]["broken.ingest"]["tasks"]["ingest"]["application_args"][2] == str(
        tmp_path / "broken.toml")
    # A schedule Airflow refuses concerns the ingest DAG only; it runs on the default.
    [cron] = problems(result, "cron.ingest")
    assert "[airflow] schedule = 'every 5 minutes'" in cron and "cron expression" in cron
    assert result["dags"]["cron.ingest"]["schedule"] == "*/5 * * * *"
    assert problems(result, "cron.backfill") == []


def test_a_bad_setting_in_the_environment_fails_only_the_dags_it_concerns(
        airflow, config_dir, tmp_path):
    """PIPELINE_SCHEDULE, PIPELINE_RETRIES and PIPELINE_SHIP_ENV with values nothing can
    use: every DAG still parses. Each value fails the runs of the DAGs that would use it,
    naming the variable: the schedule the ingest DAGs without a schedule of their own,
    the retries every DAG without its own retries, and PIPELINE_SHIP_ENV a run when it
    decides what to ship. A pipeline that sets its own is not concerned."""
    for path in config_dir.glob("*.toml"):
        (tmp_path / path.name).write_text(path.read_text())
    (tmp_path / "tuned.toml").write_text(toml_config("tuned", ["orders"]) + (
        '[airflow]\nschedule = "@hourly"\nretries = 2\n'))
    env = dag_env(tmp_path, PIPELINE_SCHEDULE="every five minutes", PIPELINE_RETRIES="many",
                  PIPELINE_SHIP_ENV="sometimes")
    result, _ = airflow.run("check", env=env)

    assert result["import_errors"] == {}
    assert len(result["dags"]) == 6
    retries, schedule = sorted(problems(result, "alpha_orders.ingest"))
    assert schedule.startswith("PIPELINE_SCHEDULE='every five minutes' is not a schedule")
    assert retries.startswith("PIPELINE_RETRIES='many' is not a valid [airflow] retries")
    assert problems(result, "alpha_orders.backfill") == [retries]
    assert result["dags"]["alpha_orders.ingest"]["schedule"] == "*/5 * * * *"
    assert problems(result, "tuned.ingest") == problems(result, "tuned.backfill") == []
    assert result["dags"]["tuned.ingest"]["schedule"] == "@hourly"

    shipping, _ = airflow.run("command", "tuned.ingest", "ingest", env=env)
    assert "PIPELINE_SHIP_ENV='sometimes' is not one of auto, always, never" in (
        shipping["error"])

    # A config folder that is not there concerns every DAG: an import error naming it,
    # rather than no DAGs and no word.
    nowhere = tmp_path / "nowhere"
    result, _ = airflow.run("check", env=dag_env(nowhere))
    assert set(result["import_errors"]) == {"ingest.py", "backfill.py"}
    assert all(f"PIPELINE_CONFIG_DIR={nowhere} is not a folder" in error
               for error in result["import_errors"].values())


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
    # Every key of the job's model of the table: a key added there must be applied here.
    assert set(tomllib.loads(AIRFLOW_TABLE)["airflow"]) == set(AirflowTable.model_fields)
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


def connection(conn_id: str, **fields) -> dict[str, str]:
    return {f"AIRFLOW_CONN_{conn_id.upper()}": json.dumps(fields)}


def test_the_command_line_comes_from_the_spark_connection(airflow, config_dir):
    env = dag_env(config_dir, PIPELINE_SPARK_CONN_ID="spark_yarn", **connection(
        "spark_yarn", conn_type="spark", host="yarn",
        extra={"deploy-mode": "client", "queue": "etl"}))
    result, _ = airflow.run("command", "alpha_orders.ingest", "ingest", env=env)
    spark_submit = str(JOB_VENV / "bin" / "spark-submit")
    # No --jars: the job reads Kafka itself. The summary file is the run's own.
    assert result["command"] == [
        spark_submit, "--master", "yarn", "--deploy-mode", "client", "--queue", "etl",
        "--conf", "spark.log.level=WARN",
        "--name", "{{ dag.dag_id }}", str(ROOT / "pipeline" / "submit.py"),
        "run", "--config", str(config_dir / "pipeline0.toml"), "--summary-file", "SUMMARY"]
    assert result["job_env"]["PYSPARK_PYTHON"] == str(JOB_VENV / "bin" / "python")
    assert result["job_env"]["PYSPARK_DRIVER_PYTHON"] == str(JOB_VENV / "bin" / "python")
    assert result["job_env"]["SPARK_LOCAL_IP"] == "127.0.0.1"

    # A standalone master with its port apart, as the UI's form stores it: the executors
    # run elsewhere, so the packed environment is shipped and their Python comes from it.
    archive = config_dir / "env.tar.gz"
    archive.write_bytes(b"")
    env = dag_env(config_dir, PIPELINE_ARCHIVE=str(archive),
                  **connection("spark_local", conn_type="spark", host="spark://10.0.0.5",
                               port=7077))
    result, _ = airflow.run("command", "alpha_orders.ingest", "ingest", env=env)
    assert result["command"][1:] == [
        "--master", "spark://10.0.0.5:7077",
        "--conf", "spark.pyspark.python=./job/bin/python",
        "--conf", f"spark.pyspark.driver.python={JOB_VENV}/bin/python",
        "--conf", "spark.log.level=WARN", "--archives", f"{archive}#job",
        "--name", "{{ dag.dag_id }}", str(ROOT / "pipeline" / "submit.py"),
        "run", "--config", str(config_dir / "pipeline0.toml"), "--summary-file", "SUMMARY"]
