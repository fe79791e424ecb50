"""The secure setup, made once per session: the stack's SASL_SSL listener and TLS Postgres
(scripts/stack up), what 'scripts/stack env' says about them, a topic the Kafka user
'pipeline' may read (its ACLs cover pipeline_*), tables made by the owner and granted to
the Postgres role 'pipeline' by sql/grants/pipeline_role.sql, and a config made from
conf/secure.toml, so the documented example is what runs."""

from __future__ import annotations

import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from confluent_kafka import ConsumerGroupTopicPartitions, TopicPartition

from tests.helpers import (
    ROOT,
    TEST_DB_NAME,
    TEST_DB_URL,
    admin,
    cli_here,
    create_topic,
    produce,
    produce_orders,
    run_cli,
    stack_env,
    unique,
)

SCHEMA = "secure"  # its own schema: the grants cover it alone
RECORDS = 600


@dataclass
class Secure:
    env: dict[str, str]  # what 'scripts/stack env' prints (helpers.stack_env)
    topic: str
    tmp: Path

    @property
    def bootstrap(self) -> str:
        return self.env["KAFKA_SECURE_BOOTSTRAP_SERVERS"]

    @property
    def secrets(self) -> list[str]:
        return [self.env["KAFKA_SASL_PASSWORD"], self.env["PIPELINE_DB_PASSWORD"]]

    def config(self, name: str, *, topics: list[str] | None = None,
               transform: str | None = None, addresses_from_env: bool = False) -> str:
        """conf/secure.toml for pipeline ``name`` on this stack, with Spark's event log on.
        ``addresses_from_env``: its listener and database port stay the ${VAR}s the file
        has ('scripts/stack env' sets them), as a user runs it; else this stack's, written."""
        text = (ROOT / "conf" / "secure.toml").read_text()
        db_host = TEST_DB_URL.split("@", 1)[1].split("/", 1)[0]
        addresses = ((("@127.0.0.1:${PG_PORT}/pipeline?",
                       f"@127.0.0.1:${{PG_PORT}}/{TEST_DB_NAME}?"),)
                     if addresses_from_env else
                     (("@127.0.0.1:${PG_PORT}/pipeline?", f"@{db_host}/{TEST_DB_NAME}?"),
                      ('bootstrap_servers = "${KAFKA_SECURE_BOOTSTRAP_SERVERS}"',
                       f'bootstrap_servers = "{self.bootstrap}"')))
        for old, new in (('name = "pipeline_demo"', f'name = "{name}"'),
                         ('topics = ["pipeline_orders"]',
                          f"topics = {topics or [self.topic]}".replace("'", '"')),
                         ('table = "pipeline_orders"', f'table = "{name}"'),
                         ('mirror_group = "pipeline_demo-mirror"',
                          f'mirror_group = "{name}-mirror"'),
                         ('schema = "public"', f'schema = "{SCHEMA}"'),
                         *addresses):
            assert old in text, f"conf/secure.toml no longer has {old!r}"
            text = text.replace(old, new)
        if transform:
            text = text.replace("max_bad_records = 1000",
                                f'max_bad_records = 1000\ntransform = "{transform}"')
        events = self.tmp / "events"
        events.mkdir(exist_ok=True)
        text += ('\n[spark.conf]\n"spark.eventLog.enabled" = "true"\n'
                 f'"spark.eventLog.dir" = "{events}"\n"spark.eventLog.compress" = "false"\n')
        path = self.tmp / f"{name}.toml"
        path.write_text(text)
        return str(path)

    def init(self, name: str) -> None:
        """As the owner: the tables (init-db), then the role's grants (psql, the real file)."""
        config = self.config(name)
        r = cli_here("init-db", "--config", config,
                    env={**self.env, "PIPELINE__DATABASE__URL": TEST_DB_URL})
        assert r.returncode == 0, r.stderr[-2000:]
        subprocess.run(["psql", TEST_DB_URL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v",
                        "role=pipeline", "-v", f"schema={SCHEMA}", "-v", f"results={name}",
                        "-f", str(ROOT / "sql" / "grants" / "pipeline_role.sql")],
                       check=True, capture_output=True)

    def run(self, config: str, *args: str, **env: str):
        """The CLI as deployed: the secure listener, the stack's secrets from the
        environment (``env`` overrides them), the database URL from the file."""
        return run_cli("-v", "run", "--config", config, *args,
                       env={**self.env, "PIPELINE__KAFKA__BOOTSTRAP_SERVERS": self.bootstrap,
                            **env}, timeout=180)


def warm_group_coordinator() -> None:
    """A fresh broker loads __consumer_offsets on its first group request: commits fail with
    COORDINATOR_LOAD_IN_PROGRESS until then (the mirror is best effort and would skip)."""
    topic = create_topic(unique("warmup"), 1)
    request = ConsumerGroupTopicPartitions(unique("warmup"), [TopicPartition(topic, 0, 0)])
    client = admin()  # alive until its futures resolve
    for _ in range(60):
        try:
            result = client.alter_consumer_group_offsets(
                [request], request_timeout=10)[request.group_id].result()
            if all(tp.error is None for tp in result.topic_partitions):
                return
        except Exception:  # noqa: BLE001 - retried until the coordinator answers
            pass
        time.sleep(0.5)
    raise AssertionError("the group coordinator did not load within 30 s")


@pytest.fixture(scope="session")
def secure(stack, tmp_path_factory) -> Secure:
    env = stack_env()
    host, port = env["KAFKA_SECURE_BOOTSTRAP_SERVERS"].split(":")
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError:
        pytest.fail(f"no SASL_SSL listener on {host}:{port}: the broker was started by an "
                    "older scripts/stack; run 'scripts/stack kafka-down && scripts/stack up'")
    topic = create_topic(unique("pipeline_sec"), 3)
    produce_orders(topic, range(RECORDS))
    produce(topic, [(b"bad", b"{not json")], partition=1)
    warm_group_coordinator()
    return Secure(env, topic, tmp_path_factory.mktemp("secure"))


@pytest.fixture(scope="session")
def other_ca(secure) -> str:
    """A CA nobody's certificate was signed by."""
    d = secure.tmp / "other-ca"
    d.mkdir()
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
                    "-keyout", str(d / "ca.key"), "-out", str(d / "ca.pem"),
                    "-subj", "/CN=untrusted test CA"], check=True, capture_output=True)
    return str(d / "ca.pem")


@pytest.fixture(scope="session")
def forbidden_topic() -> str:
    """A topic the ACLs do not give the Kafka user 'pipeline' (outside pipeline_*)."""
    topic = create_topic(unique("other"), 1)
    produce_orders(topic, range(10))
    return topic

