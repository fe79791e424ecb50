"""Security as deployed: the CLI reads over SASL_SSL (SCRAM-SHA-512, the stack's CA) as
the Kafka user 'pipeline' under ACLs, and writes over TLS (verify-full) as the Postgres
role 'pipeline', which is no superuser and holds only sql/grants/pipeline_role.sql. Each
refusal (a wrong password, an untrusted CA, a topic the ACLs do not give) is one error
line, exit 2, at once; no secret shows in any output, run row or Spark event log."""

from __future__ import annotations

import json
import time

import psycopg
import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

from tests.helpers import TEST_DB_NAME, TEST_DB_URL, admin, query, unique, watermarks
from tests.security.conftest import RECORDS, SCHEMA

EXIT_CONFIG = 2


def secure_url(secure, password: str | None = None, ca: str | None = None,
               sslmode: str = "verify-full") -> str:
    host = TEST_DB_URL.split("@", 1)[1].split("/", 1)[0]
    return (f"postgresql://pipeline:{password or secure.env['PIPELINE_DB_PASSWORD']}@{host}"
            f"/{TEST_DB_NAME}?sslmode={sslmode}&sslrootcert={ca or secure.env['PG_SSLROOTCERT']}")


def everything_printed_or_stored(secure, name: str, *results) -> str:
    """stdout, stderr (the log included: -v), the pipeline's run rows, Spark's event log."""
    rows = query(f"SELECT row_to_json(r)::text FROM {SCHEMA}.pipeline_runs r "
                 "WHERE pipeline = %s", (name,))
    events = [p.read_text(errors="replace") for p in (secure.tmp / "events").rglob("*")
              if p.is_file()]
    return "\n".join([*(r.stdout + r.stderr for r in results), *(r[0] for r in rows),
                      *events])


def assert_no_secret(secure, text: str) -> None:
    for secret in secure.secrets:
        assert secret not in text, f"a secret leaked: ...{text[text.find(secret) - 200:][:300]}"


def one_error(result) -> str:
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, result.stderr[-3000:]
    assert result.returncode == EXIT_CONFIG, result.stderr[-3000:]
    return errors[0]


def rows_and_records(secure, name: str):
    """What the table holds and what Kafka holds, both as (partition, offset, order_id)."""
    from confluent_kafka import Consumer

    rows = query(f'SELECT "partition", "offset", order_id FROM {SCHEMA}.{name} '
                 f"WHERE topic = %s ORDER BY 1, 2", (secure.topic,))
    consumer = Consumer({"bootstrap.servers": admin_bootstrap(), "group.id": unique("check"),
                         "enable.auto.commit": False})
    ends = watermarks(secure.topic)
    consumer.assign([TopicPartition(secure.topic, p, 0) for p in ends])
    records, left = [], sum(hi for _, hi in ends.values())
    while left:
        for m in consumer.consume(1000, timeout=5):
            left -= 1
            if m.value() != b"{not json":
                records.append((m.partition(), m.offset(), json.loads(m.value())["order_id"]))
    consumer.close()
    return rows, sorted(records)


def admin_bootstrap() -> str:
    from tests.helpers import BOOTSTRAP

    return BOOTSTRAP


def test_ingest_over_sasl_ssl_as_the_pipeline_role_lands_every_record_exactly_once(secure):
    name = unique("pipeline_sec")
    secure.init(name)
    config = secure.config(name)

    first = secure.run(config, "--json")
    again = secure.run(config)

    assert first.returncode == 0, first.stderr[-3000:]
    assert json.loads(first.stdout)["rows_written"] == RECORDS
    rows, records = rows_and_records(secure, name)
    assert rows == records and len(rows) == RECORDS
    assert query(f"SELECT count(*) FROM {SCHEMA}.pipeline_dead_letters WHERE pipeline = %s",
                 (name,)) == [(1,)]
    ends = {p: hi for p, (_, hi) in watermarks(secure.topic).items()}
    stored = dict(query(f'SELECT "partition", next_offset FROM {SCHEMA}.pipeline_offsets '
                        "WHERE pipeline = %s", (name,)))
    assert stored == ends
    assert again.returncode == 0 and "nothing new to read" in again.stdout, again.stderr
    # The mirror: committed to the group under the ACLs, by the pipeline user.
    assert f"mirrored 3 offsets to consumer group {name}-mirror" in first.stderr
    request = ConsumerGroupTopicPartitions(
        f"{name}-mirror", [TopicPartition(secure.topic, p) for p in ends])
    client = admin()  # alive until its future resolves
    committed = client.list_consumer_group_offsets(
        [request], request_timeout=10)[request.group_id].result()
    assert {tp.partition: tp.offset for tp in committed.topic_partitions} == ends
    assert_no_secret(secure, everything_printed_or_stored(secure, name, first, again))


def test_a_transform_reads_over_sasl_ssl_with_the_executors_consumer(secure):
    """A transform's input is the built-in read (executor/transform/feed.py): librdkafka with
    [kafka.consumer]'s SASL_SSL settings, as every run; no Java client takes part."""
    name = unique("pipeline_sec")
    secure.init(name)
    config = secure.config(name, transform="tests.integration.transforms.orders:identity")

    run = secure.run(config)

    assert run.returncode == 0, run.stderr[-3000:]
    rows, records = rows_and_records(secure, name)
    assert rows == records and len(rows) == RECORDS
    events = everything_printed_or_stored(secure, name, run)
    assert "MapInArrow" in events and "KafkaRelation" not in events  # from the event log
    assert_no_secret(secure, events)


def test_the_pipeline_role_logs_in_over_tls_only_and_holds_only_its_grants(secure):
    name = unique("pipeline_sec")
    secure.init(name)
    with psycopg.connect(secure_url(secure)) as conn:
        assert conn.execute("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()"
                            ).fetchone() == (True,)
        assert conn.execute("SELECT rolsuper, rolcreaterole, rolcreatedb FROM pg_roles "
                            "WHERE rolname = current_user").fetchone() == (False, False, False)
        privileges = conn.execute(
            "SELECT has_table_privilege(%s, 'INSERT'), has_table_privilege(%s, 'TRUNCATE'), "
            "has_table_privilege(%s, 'DELETE'), "
            "has_database_privilege(current_database(), 'CREATE')",
            (f"{SCHEMA}.{name}", f"{SCHEMA}.{name}", f"{SCHEMA}.pipeline_runs")).fetchone()
        assert privileges == (True, False, False, False)
    with pytest.raises(psycopg.OperationalError, match="pg_hba.conf rejects connection"):
        psycopg.connect(secure_url(secure, sslmode="disable"))


def test_wrong_kafka_password_is_one_config_error(secure):
    name = unique("pipeline_sec")
    secure.init(name)
    started = time.monotonic()
    # A common word, the user's own name: masked where it stands, the message intact.
    r = secure.run(secure.config(name), KAFKA_SASL_PASSWORD="pipeline")
    error = one_error(r)
    assert time.monotonic() - started < 30
    assert error.startswith(f"error: Kafka at {secure.bootstrap} refused user 'pipeline' "
                            "(SCRAM-SHA-512): authentication failed"), error
    assert "sasl.password" in error and "not retried" in error
    assert_no_secret(secure, everything_printed_or_stored(secure, name, r))


def test_wrong_postgres_password_is_one_config_error(secure):
    name = unique("pipeline_sec")
    secure.init(name)
    started = time.monotonic()
    r = secure.run(secure.config(name), PIPELINE_DB_PASSWORD="error")
    error = one_error(r)
    assert time.monotonic() - started < 30
    host = TEST_DB_URL.split("@", 1)[1].split("/", 1)[0]
    assert error.startswith(f"error: Postgres at postgresql://pipeline:***@{host}/{TEST_DB_NAME}"
                            "?sslmode=verify-full"), error
    assert 'password authentication failed for user "pipeline"' in error
    assert_no_secret(secure, everything_printed_or_stored(secure, name, r))


def test_an_untrusted_ca_is_one_config_error_for_kafka_and_for_postgres(secure, other_ca):
    name = unique("pipeline_sec")
    secure.init(name)
    config = secure.config(name)
    started = time.monotonic()
    kafka = secure.run(config, KAFKA_SSL_CA=other_ca)
    postgres = secure.run(config, PG_SSLROOTCERT=other_ca)

    assert time.monotonic() - started < 60
    kafka_error, postgres_error = one_error(kafka), one_error(postgres)
    assert kafka_error.startswith(f"error: Kafka at {secure.bootstrap} refused user "
                                  "'pipeline' (SCRAM-SHA-512): the TLS handshake failed"), \
        kafka_error
    assert "certificate verify failed" in kafka_error and "ssl.ca.location" in kafka_error
    assert postgres_error.startswith("error: Postgres at postgresql://pipeline:***@"), \
        postgres_error
    assert "certificate verify failed" in postgres_error
    assert_no_secret(secure, everything_printed_or_stored(secure, name, kafka, postgres))


def test_a_topic_the_user_may_not_read_is_one_config_error(secure, forbidden_topic):
    name = unique("pipeline_sec")
    secure.init(name)
    started = time.monotonic()
    r = secure.run(secure.config(name, topics=[forbidden_topic]))
    error = one_error(r)
    assert time.monotonic() - started < 30
    assert error.startswith(f"error: Kafka at {secure.bootstrap} does not allow user "
                            f"'pipeline' (SCRAM-SHA-512) to describe topic '{forbidden_topic}'"
                            ), error
    assert_no_secret(secure, everything_printed_or_stored(secure, name, r))


def test_a_consumer_group_the_user_may_not_use_is_one_config_error(secure):
    """The executors' readers look up the group '<pipeline name>-reader': a pipeline named
    outside the ACLs' pipeline_* is refused inside its Spark tasks, not retried."""
    name = unique("sec_noacl")
    secure.init(name)
    started = time.monotonic()

    r = secure.run(secure.config(name))

    error = one_error(r)
    assert time.monotonic() - started < 60
    assert f"error: Kafka at {secure.bootstrap} refused the reader of {secure.topic}[" in error
    assert f"consumer group '{name}-reader'): " in error and "Group authorization" in error
    assert query(f"SELECT status, exit_code FROM {SCHEMA}.pipeline_runs WHERE pipeline = %s",
                 (name,)) == [("failed", EXIT_CONFIG)]
    assert_no_secret(secure, everything_printed_or_stored(secure, name, r))


def test_a_reader_whose_group_the_acls_forbid_is_refused_before_it_takes_a_record(secure):
    """The executors' reader looks its group up before it takes any record, so a forbidden
    group is refused on every read, however small the range. Before, librdkafka's group
    lookup raced the (allowed) fetches: of 20 such reads of one partition 3-4 read their
    range whole and returned its records (this test failed so; the CLI test above fetched
    1 KB at a time to make the race unlikely)."""
    from pipeline.errors import Kind
    from pipeline.executor.consume import RangeReadError, read_ranges, reader_config
    from pipeline.plan.offsets import OffsetRange

    client = {"bootstrap.servers": secure.bootstrap, "security.protocol": "SASL_SSL",
              "sasl.mechanism": "SCRAM-SHA-512", "sasl.username": "pipeline",
              "sasl.password": secure.env["KAFKA_SASL_PASSWORD"],
              "ssl.ca.location": secure.env["KAFKA_SSL_CA"]}
    _, end = watermarks(secure.topic)[0]
    for attempt in range(20):
        group = f"{unique('sec_noacl')}-reader"  # outside the ACLs' pipeline_*
        with pytest.raises(RangeReadError) as refused:
            taken = [records for _, records in read_ranges(
                reader_config(client, "read_committed", group),
                [OffsetRange(secure.topic, 0, 0, end)], 30)]
            pytest.fail(f"read {sum(map(len, taken))} records in attempt {attempt}")
        assert refused.value.kind == Kind.CONFIG, refused.value
        assert f"consumer group '{group}'" in refused.value.message
        assert "Group authorization" in refused.value.message


def test_the_documented_flow_runs_as_the_role_over_sasl_ssl_in_a_shell_that_sourced_the_env(
        secure):
    # docs/security.md, as a user types it: 'source <(scripts/stack env)', then run
    # conf/secure.toml (its names and database made the test's; its listener and port are
    # the file's ${VAR}s). Paused in the publishing transaction: its connections to
    # Postgres are the role's, over TLS.
    import os
    import shlex
    import subprocess
    import sys

    from tests.helpers import ROOT, without_product_env

    name = unique("pipeline_doc")
    secure.init(name)
    config = secure.config(name, addresses_from_env=True)
    shell = (f"source <({shlex.quote(str(ROOT / 'scripts' / 'stack'))} env) && exec "
             f"{shlex.quote(sys.executable)} -m pipeline run --config {shlex.quote(config)}")
    env = {**without_product_env(os.environ), "PIPELINE_FAULT": "after_stage:sleep=15"}
    run = subprocess.Popen(["bash", "-c", shell], cwd=ROOT, env=env, text=True,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    said = []
    for line in run.stderr:
        said.append(line)
        if "fault injection: sleeping at after_stage" in line:
            break
    sessions = query("SELECT a.usename, s.ssl FROM pg_stat_activity a JOIN pg_stat_ssl s "
                     "USING (pid) WHERE a.datname = %s AND a.application_name "
                     "LIKE 'kafka-offset-pipeline%%'", (TEST_DB_NAME,))
    out, err = run.communicate(timeout=180)
    said.append(err)

    assert run.returncode == 0, "".join(said)[-3000:]
    assert sessions and set(sessions) == {("pipeline", True)}, sessions
    assert "is set by the environment" not in "".join(said), "".join(said)
    assert query(f"SELECT count(*) FROM {SCHEMA}.{name}") == [(RECORDS,)]


def test_sasl_ssl_sent_to_the_plaintext_listener_by_an_override_fails_at_once_saying_so(
        secure):
    # The trap the documented flow fell into: a PIPELINE__KAFKA__BOOTSTRAP_SERVERS of the
    # PLAINTEXT listener replacing the file's. Exit 2 naming the mismatch (not 75, "Kafka
    # unreachable", after kafka.timeout_seconds of retries), and the log names the key.
    name = unique("pipeline_mismatch")
    secure.init(name)
    config = secure.config(name)

    result = secure.run(config, PIPELINE__KAFKA__BOOTSTRAP_SERVERS=admin_bootstrap())

    error = one_error(result)
    assert f"Kafka at {admin_bootstrap()} is not a SASL_SSL listener: it speaks TLS to a " \
           "PLAINTEXT listener" in error, error
    assert ("config: kafka.bootstrap_servers is set by the environment "
            "(PIPELINE__KAFKA__BOOTSTRAP_SERVERS)") in result.stderr, result.stderr[-2000:]
