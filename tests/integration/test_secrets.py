"""Secrets never leak: the database password and the SASL password appear in no log line,
no error, no run row and no --dry-run output - in successful runs and in failing ones.

A real role with a password is created on the shared server (trust auth accepts any
password: what matters is that the string never shows up anywhere)."""

from __future__ import annotations

import uuid

import psycopg
import pytest

from tests.helpers import (
    BOOTSTRAP,
    TEST_DB_NAME,
    TEST_DB_URL,
    create_topic,
    make_settings,
    produce,
    produce_orders,
    query,
    run_cli,
    toml_config,
    unique,
)
from tests.integration._reliability import free_ports, init_db

TOKEN = uuid.uuid4().hex[:12]
# Percent-encoded in the URL ("%40" is "@"): neither the encoded nor the decoded form may
# leak, so the tests look for the distinctive tail both share.
DB_PASSWORD_IN_URL = f"db%40pw-{TOKEN}"
SASL_PASSWORD = f"sasl-pw-{TOKEN}"
SECRETS = [f"pw-{TOKEN}", SASL_PASSWORD]


@pytest.fixture(scope="module")
def role(stack):
    name = unique("secret_role")
    with psycopg.connect(TEST_DB_URL, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {name} LOGIN PASSWORD 'db@pw-{TOKEN}'")
        try:
            conn.execute(f"GRANT pg_read_all_data, pg_write_all_data TO {name}")
            conn.execute(f"GRANT CREATE ON SCHEMA public TO {name}")
            yield name
        finally:
            conn.execute(f"DROP OWNED BY {name}")
            conn.execute(f"DROP ROLE {name}")


def url_for(role: str, port: int | None = None, database: str = TEST_DB_NAME) -> str:
    host = TEST_DB_URL.split("@", 1)[1].split("/", 1)[0]
    if port is not None:
        host = f"127.0.0.1:{port}"
    return f"postgresql://{role}:{DB_PASSWORD_IN_URL}@{host}/{database}"


# A SASL secret as librdkafka (every client of a run) takes it.
SASL_CONSUMER = ('[kafka.consumer]\n"sasl.username" = "pipeline"\n'
                 '"sasl.password" = "${TEST_SASL_PASSWORD}"\n')


def pipeline_with_secrets(tmp_path, role: str, *, bootstrap: str = BOOTSTRAP,
                          db_url: str | None = None):
    name = unique("secrets")
    topic = create_topic(name, 2)
    produce_orders(topic, range(300))
    produce(topic, [(b"bad", b"{not json")])
    init_db(make_settings(name, [topic]))  # as postgres: the tables exist, the role writes
    config = tmp_path / f"{name}.toml"
    # The SASL password comes from the environment through ${...}, as documented; security
    # stays PLAINTEXT, so librdkafka accepts and ignores the credentials.
    config.write_text(toml_config(name, [topic], bootstrap=bootstrap,
                                  db_url=db_url or url_for(role), extra_kafka=SASL_CONSUMER)
                      .replace("timeout_seconds = 10", "timeout_seconds = 3"))
    return name, str(config)


def run(config: str, *args: str, fault: str | None = None, bootstrap: str = BOOTSTRAP):
    env = {"TEST_SASL_PASSWORD": SASL_PASSWORD, "PIPELINE__KAFKA__BOOTSTRAP_SERVERS": bootstrap}
    if fault:
        env["PIPELINE_FAULT"] = fault
    return run_cli("-v", "run", "--config", config, *args, env=env)


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text, f"secret {secret!r} leaked:\n{excerpt(text, secret)}"


def excerpt(text: str, secret: str) -> str:
    i = text.find(secret)
    return text[max(0, i - 300):i + 100]


def run_rows(name: str) -> str:
    return "\n".join(r[0] for r in query(
        "SELECT row_to_json(r)::text FROM pipeline_runs r WHERE pipeline = %s", (name,)))


def test_successful_run_and_dry_run_show_no_secret(role, tmp_path):
    name, config = pipeline_with_secrets(tmp_path, role)

    dry = run(config, "--dry-run")
    assert dry.returncode == 0, dry.stderr[-3000:]
    assert "partitions, 301 offsets to read" in dry.stdout
    ok = run(config, "--json")
    assert ok.returncode == 0, ok.stderr[-3000:]

    assert_no_secret(dry.stdout, dry.stderr, ok.stdout, ok.stderr, run_rows(name))
    assert query(f"SELECT count(*) FROM {name}")[0][0] == 300  # it really ran, as the role


def test_failing_runs_show_no_secret_in_errors_logs_or_the_run_row(role, tmp_path):
    name, config = pipeline_with_secrets(tmp_path, role)
    # 1. A failure inside a Spark task: its long error text goes into the run row.
    in_spark = run(config, fault="during_read:raise")
    assert in_spark.returncode != 0 and "error: " in in_spark.stderr
    [(error,)] = query("SELECT error FROM pipeline_runs WHERE pipeline = %s", (name,))
    assert "injected fault" in error

    # 2. Kafka unreachable (a closed port).
    [closed] = free_ports(1)
    _, unreachable_config = pipeline_with_secrets(tmp_path, role)
    no_kafka = run(unreachable_config, bootstrap=f"127.0.0.1:{closed}")
    assert no_kafka.returncode == 75, no_kafka.stderr[-3000:]
    assert "Kafka unreachable" in no_kafka.stderr

    # 3. A database that does not exist, and a server that is not there.
    errors = []
    for db_url in (url_for(role, database=f"nosuch_{TOKEN[:4]}"), url_for(role, port=closed)):
        _, bad_db_config = pipeline_with_secrets(tmp_path, role, db_url=db_url)
        r = run(bad_db_config)
        assert r.returncode == 75, r.stderr[-3000:]
        assert f"Postgres unreachable at postgresql://{role}:***@" in r.stderr
        errors += [r.stdout, r.stderr]

    assert_no_secret(in_spark.stdout, in_spark.stderr, no_kafka.stdout, no_kafka.stderr,
                     *errors, run_rows(name))
