"""Deployed the way Airflow users deploy: the credentials live in Airflow Connections (here
AIRFLOW_CONN_<ID> variables in their JSON form, the secrets backend every Airflow has),
named by the pipeline's [airflow] table, and resolved when the task runs. The config itself
holds no usable address and no secret; the job reaches the stack's secure side through the
connections - Kafka's SASL_SSL listener (SCRAM, the broker's CA) as the user 'pipeline',
Postgres over TLS (verify-full) as the role 'pipeline' - and no secret shows in the task
log or on the command line. The same run emits OpenLineage events through a real file
transport: the topics read, the table written and the run's offsets."""

from __future__ import annotations

import json

import pytest

from tests.airflow.conftest import dag_env, task
from tests.helpers import (
    TEST_DB_NAME,
    TEST_DB_URL,
    cli_here,
    create_topic,
    grant_job_role,
    produce_orders,
    query,
    result_keys,
    stack_env,
    toml_config,
    unique,
    watermarks,
)

pytestmark = pytest.mark.airflow

SUBMIT = "spark-submit command:"
KAFKA_CONN, DB_CONN = "orders_kafka", "orders_db"
# The config refers to the Kafka connection's client settings by name (KAFKA_<KEY>), the
# way conf/secure.toml refers to the environment; the values come from the connection.
KAFKA_REFERENCES = """
[kafka.consumer]
"security.protocol" = "${KAFKA_SECURITY_PROTOCOL}"
"sasl.mechanism" = "${KAFKA_SASL_MECHANISM}"
[kafka.admin_client]
"sasl.username" = "${KAFKA_SASL_USERNAME}"
"sasl.password" = "${KAFKA_SASL_PASSWORD}"
"ssl.ca.location" = "${KAFKA_SSL_CA_LOCATION}"
"""
NOWHERE_DB = "postgresql://nobody@127.0.0.1:1/nowhere"
NOWHERE_KAFKA = "127.0.0.1:1"


def connection_env(stack: dict[str, str]) -> dict[str, str]:
    """The two connections as an operator would define them (UI, CLI or a secrets
    backend): the Kafka provider's shape (client settings as the extra), and Postgres's
    (schema = the database; libpq's TLS parameters in the extra)."""
    kafka = {"conn_type": "kafka", "extra": {
        "bootstrap.servers": stack["KAFKA_SECURE_BOOTSTRAP_SERVERS"],
        "security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
        "sasl.username": stack["KAFKA_SASL_USERNAME"],
        "sasl.password": stack["KAFKA_SASL_PASSWORD"],
        "ssl.ca.location": stack["KAFKA_SSL_CA"]}}
    postgres = {"conn_type": "postgres", "host": "127.0.0.1", "port": int(stack["PG_PORT"]),
                "login": stack["PIPELINE_DB_USER"], "password": stack["PIPELINE_DB_PASSWORD"],
                "schema": TEST_DB_NAME,
                "extra": {"sslmode": "verify-full", "sslrootcert": stack["PG_SSLROOTCERT"]}}
    return {f"AIRFLOW_CONN_{KAFKA_CONN.upper()}": json.dumps(kafka),
            f"AIRFLOW_CONN_{DB_CONN.upper()}": json.dumps(postgres)}


@pytest.fixture(scope="module")
def secure_run(stack, airflow, tmp_path_factory):
    """One ingest DAG run whose every credential comes from a connection, with the
    OpenLineage file transport on."""
    directory = tmp_path_factory.mktemp("connections")
    secrets = stack_env()
    # The stack's ACLs let the Kafka user 'pipeline' read pipeline_* topics and groups.
    name = unique("pipeline_afconn")
    create_topic(name, 2)
    produce_orders(name, range(30))
    config = directory / f"{name}.toml"
    config.write_text(
        toml_config(name, [name], bootstrap=NOWHERE_KAFKA, db_url=NOWHERE_DB,
                    extra_kafka=KAFKA_REFERENCES)
        + f'[airflow]\nkafka_conn_id = "{KAFKA_CONN}"\npostgres_conn_id = "{DB_CONN}"\n')
    # The tables, as the owner (a deployment step), then the role's grants.
    refs = {k: "x" for k in ("KAFKA_SECURITY_PROTOCOL", "KAFKA_SASL_MECHANISM",
                             "KAFKA_SASL_USERNAME", "KAFKA_SASL_PASSWORD",
                             "KAFKA_SSL_CA_LOCATION")}
    r = cli_here("init-db", "--config", str(config),
                env={"PIPELINE__DATABASE__URL": TEST_DB_URL, **refs})
    assert r.returncode == 0, r.stderr[-2000:]
    grant_job_role("public", name)
    lineage = directory / "openlineage.jsonl"
    transport = {"type": "file", "log_file_path": str(lineage), "append": True}
    [run] = airflow.dag_test(f"{name}.ingest", None, env=dag_env(
        directory, **connection_env(secrets),
        AIRFLOW__OPENLINEAGE__TRANSPORT=json.dumps(transport),
        AIRFLOW__OPENLINEAGE__NAMESPACE="pipeline_tests"))
    events = [json.loads(line) for line in lineage.read_text().splitlines()
              ] if lineage.exists() else []
    return name, run, secrets, events


def test_credentials_come_from_connections_and_never_show(secure_run):
    name, run, secrets, _ = secure_run
    assert run["state"] == "success", run["log"][-4000:]
    assert task(run, "ingest")["try_number"] == 1
    summary = run["xcom"]["ingest"]
    assert (summary["status"], summary["records_read"], summary["rows_written"]) == (
        "succeeded", 30, 30)
    # The config's own addresses lead nowhere: every record came through the connections.
    ends = {part: high for part, (_, high) in watermarks(name).items()}
    assert result_keys(name) == sorted(
        (name, part, offset) for part, high in ends.items() for offset in range(high))
    assert query("SELECT status, records_read FROM pipeline_runs WHERE pipeline = %s",
                 (name,)) == [("succeeded", 30)]
    log = run["log"]
    assert f"database from connection '{DB_CONN}' (pipeline@127.0.0.1:" in log
    assert (f"Kafka from connection '{KAFKA_CONN}': bootstrap servers "
            f"{secrets['KAFKA_SECURE_BOOTSTRAP_SERVERS']}") in log
    assert "does not use" not in log  # every setting of the connection is referenced
    [command] = [line for line in log.splitlines() if SUBMIT in line]
    for secret in (secrets["KAFKA_SASL_PASSWORD"], secrets["PIPELINE_DB_PASSWORD"]):
        assert secret not in log
    assert "sasl" not in command.lower() and "password" not in command.lower()
    assert TEST_DB_NAME not in command  # not even the database URL is on it


def test_openlineage_events_name_the_topics_the_table_and_the_offsets(secure_run):
    name, run, secrets, events = secure_run
    assert run["state"] == "success", run["log"][-4000:]
    complete = [e for e in events if e["eventType"] == "COMPLETE"
                and e["job"]["name"] == f"{name}.ingest.ingest"]
    assert len(complete) == 1, [(e["eventType"], e["job"]["name"]) for e in events]
    [event] = complete
    assert event["job"]["namespace"] == "pipeline_tests"
    kafka = f"kafka://{secrets['KAFKA_SECURE_BOOTSTRAP_SERVERS']}"
    assert [(d["namespace"], d["name"]) for d in event["inputs"]] == [(kafka, name)]
    postgres = f"postgres://127.0.0.1:{secrets['PG_PORT']}"
    assert [(d["namespace"], d["name"]) for d in event["outputs"]] == [
        (postgres, f"{TEST_DB_NAME}.public.{name}")]
    facet = event["run"]["facets"]["kafkaOffsetPipeline_offsets"]
    ends = {part: high for part, (_, high) in watermarks(name).items()}
    assert sorted((r["topic"], r["partition"], r["from"], r["until"])
                  for r in facet["ranges"]) == sorted(
        (name, part, 0, high) for part, high in ends.items())
    assert (facet["kind"], facet["status"], facet["recordsRead"], facet["rowsWritten"]) == (
        "ingest", "succeeded", 30, 30)
    assert facet["runId"] == run["xcom"]["ingest"]["run_id"]
    assert secrets["KAFKA_SASL_PASSWORD"] not in json.dumps(events)
