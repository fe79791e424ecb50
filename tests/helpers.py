"""Test helpers shared by the integration tests: topics, producers, settings, queries."""

from __future__ import annotations

import functools
import json
import os
import re
import subprocess
import sys
import time
import tomllib
import uuid
import venv
from pathlib import Path
from typing import Any

import psycopg
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic
from sqlalchemy.engine import make_url

from pipeline.config import Settings, parse_settings
from pipeline.errors import TransientError

ROOT = Path(__file__).resolve().parent.parent
UV = ROOT / ".tools" / "bin" / "uv"  # scripts/stack installs it, pinned
WHEELS = ROOT / ".tools" / "wheels"  # and builds pyspark's wheel here once


def pip_install(env_dir: Path, *args: str) -> subprocess.CompletedProcess:
    """``pip install ARGS`` into the venv ``env_dir`` as scripts/stack installs: by uv (its
    cache already holds what the stack's venvs resolved), or pip where uv is absent; the
    stack's pyspark wheel found first, not built again from its sdist (scripts/stack
    pyspark_wheel)."""
    cmd = ([str(UV), "pip", "install", "-q", "-p", str(env_dir / "bin" / "python")]
           if UV.exists() else
           [str(env_dir / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"])
    if WHEELS.is_dir():
        cmd += ["--find-links", str(WHEELS)]
    return subprocess.run([*cmd, *args], capture_output=True, text=True)


def wheel_venv(base: Path, requirement: str = "", check: bool = False) -> Path:
    """A fresh venv under ``base`` with the wheel built from this checkout installed (with
    ``requirement``'s extras, e.g. "[airflow]"), its dependencies pinned as .venv's
    (constraints/spark-4.0.txt): the package as a user installs it. By uv where the stack
    installed it (a build and an install from its warm cache: seconds where pip took
    minutes), else by pip. ``check``: the installed set must be consistent (pip check)."""
    dist, env_dir = base / "dist", base / "venv"
    if UV.exists():
        subprocess.run([str(UV), "build", "-q", "--wheel", "-o", str(dist), str(ROOT)],
                       check=True, capture_output=True, cwd=base)
        subprocess.run([str(UV), "venv", "-q", "-p", sys.executable, str(env_dir)],
                       check=True, capture_output=True)
    else:
        subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                        "--disable-pip-version-check", "-w", str(dist), str(ROOT)],
                       check=True, capture_output=True, cwd=base)
        venv.create(env_dir, with_pip=True)
    wheel = next(dist.glob("kafka_offset_pipeline-*.whl"))
    install = pip_install(env_dir, f"{wheel}{requirement}",
                          "-c", str(ROOT / "constraints" / "spark-4.0.txt"))
    assert install.returncode == 0, install.stderr[-4000:]
    if check:
        cmd = ([str(UV), "pip", "check", "-p", str(env_dir / "bin" / "python")] if UV.exists()
               else [str(env_dir / "bin" / "pip"), "check"])
        consistent = subprocess.run(cmd, capture_output=True, text=True)
        assert consistent.returncode == 0, consistent.stdout + consistent.stderr
    return env_dir


# Where the test broker is: the harness's own name (scripts/test and 'scripts/stack env' set it).
# KAFKA_BOOTSTRAP_SERVERS, which shells and older notes export for the same, is read as a
# fallback here only; tests/conftest.py then hides it from the code under test.
BOOTSTRAP = (os.environ.get("PIPELINE_TEST_BOOTSTRAP_SERVERS")
             or os.environ.get("KAFKA_BOOTSTRAP_SERVERS")
             or f"127.0.0.1:{os.environ.get('KAFKA_PORT', '9092')}")


def own_database(url: str, environ=os.environ) -> str:
    """``url`` with the database this pytest process owns: under pytest-xdist each worker
    has its own copy (pipeline_test_gw0, ...), so workers share no table; a pass that runs
    beside another (scripts/test's Spark 3.5 pass) adds PIPELINE_TEST_DATABASE_SUFFIX. The
    session's ``stack`` fixture creates it (tests/conftest.py)."""
    parts = [environ.get("PIPELINE_TEST_DATABASE_SUFFIX"), environ.get("PYTEST_XDIST_WORKER")]
    suffix = "_".join(p for p in parts if p)
    u = make_url(url)
    if not suffix or u.database.endswith(f"_{suffix}"):  # a subprocess of a worker
        return url
    return u.set(database=f"{u.database}_{suffix}").render_as_string(hide_password=False)


# The owner's URL: tests create tables (init-db) and check what landed with it. The job
# itself runs as the stack's least-privilege role (job_db_url), as deployed.
TEST_DB_URL = own_database(os.environ.get("PIPELINE_TEST_DATABASE_URL",
                                          "postgresql://postgres@127.0.0.1:5433/pipeline_test"))
TEST_DB_NAME = make_url(TEST_DB_URL).database
JSON_COLUMNS = {"order_id": "long not null", "customer": "string not null",
                "amount": "decimal(12,2)", "placed_at": "timestamp"}


def unique(prefix: str = "t") -> str:
    return f"{prefix}_{uuid.uuid4().hex[:10]}"


def admin(bootstrap: str = BOOTSTRAP) -> AdminClient:
    return AdminClient({"bootstrap.servers": bootstrap})


# Topics this process created on the suite's broker: an integration module's are deleted
# when it ends (tests/conftest.py), so the broker's disk holds one module's data, not the
# whole suite's (gigabytes: 1 MB records, soaks, wide topics).
CREATED_TOPICS: list[str] = []


def create_topic(name: str, partitions: int = 3, bootstrap: str = BOOTSTRAP,
                 **config: str) -> str:
    client = admin(bootstrap)  # keep the handle alive until the future resolves
    client.create_topics([NewTopic(name, partitions, 1, config=config)])[name].result()
    if bootstrap == BOOTSTRAP:
        CREATED_TOPICS.append(name)
    # Metadata propagates asynchronously even on one node.
    for _ in range(50):
        md = admin(bootstrap).list_topics(name, timeout=5)
        if name in md.topics and len(md.topics[name].partitions) == partitions:
            return name
        time.sleep(0.1)
    raise AssertionError(f"topic {name} did not appear")


def produce(topic: str, records: list[tuple[bytes | None, bytes | None]] | None = None, *,
            partition: int | None = None, bootstrap: str = BOOTSTRAP,
            headers: list | None = None) -> None:
    # Idempotent: a retried batch (a slow broker under a loaded CI machine) keeps its place,
    # so offsets follow the order given here, which the tests' expected rows assume.
    p = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5, "enable.idempotence": True})
    for key, value in records or []:
        kwargs: dict[str, Any] = {}
        if partition is not None:
            kwargs["partition"] = partition
        if headers is not None:
            kwargs["headers"] = headers
        p.produce(topic, key=key, value=value, **kwargs)
    assert p.flush(30) == 0


def produce_orders(topic: str, ids, partition: int | None = None,
                   bootstrap: str = BOOTSTRAP) -> None:
    from pipeline.sample import order

    produce(topic, [(f"order-{i}".encode(), order(i)) for i in ids], partition=partition,
            bootstrap=bootstrap)


def watermarks(topic: str, bootstrap: str = BOOTSTRAP) -> dict[int, tuple[int, int]]:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": unique("wm")})
    try:
        md = c.list_topics(topic, timeout=10)
        return {p: c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)
                for p in md.topics[topic].partitions}
    finally:
        c.close()


def make_settings(name: str, topics: list[str], *, fmt: str = "json", table: str | None = None,
                  bootstrap: str = BOOTSTRAP, db_url: str = TEST_DB_URL,
                  kafka: dict | None = None, sink: dict | None = None,
                  spark: dict | None = None) -> Settings:
    doc = {
        "pipeline": {"name": name},
        "kafka": {"bootstrap_servers": bootstrap, "topics": topics, "timeout_seconds": 10,
                  **(kafka or {})},
        "database": {"url": db_url},
        "sink": {"format": fmt, "table": table or name, "max_bad_records": -1,
                 **({"columns": JSON_COLUMNS} if fmt == "json" else {}), **(sink or {})},
        "spark": {"master": "local[2]", **(spark or {})},
    }
    return parse_settings(doc, source=f"<test {name}>", environ={})


def stack_env() -> dict[str, str]:
    """What 'scripts/stack env' prints for the stack the tests use (its ports, its secrets),
    less any of the job's own overrides (product_env; the script prints none: one would
    replace a test config's value wherever this is passed to the job); a test sets the
    overrides it means."""
    out = subprocess.run([str(ROOT / "scripts" / "stack"), "env"], check=True,
                         capture_output=True, text=True).stdout
    return without_product_env(dict(re.findall(r"^export (\w+)=(.*)$", out, re.M)))


@functools.cache
def job_db_url() -> str:
    """TEST_DB_URL as the job's role: 'pipeline' (not a superuser, only the grants of
    sql/grants/pipeline_role.sql), SCRAM password, TLS with the server's name verified."""
    env = stack_env()
    return make_url(TEST_DB_URL).set(
        username=env["PIPELINE_DB_USER"], password=env["PIPELINE_DB_PASSWORD"],
        query={"sslmode": "verify-full", "sslrootcert": env["PG_SSLROOTCERT"]},
    ).render_as_string(hide_password=False)


def grant_job_role(schema: str, table: str) -> None:
    """As the owner, what a deployment does after init-db: the role's grants (the real file)."""
    subprocess.run(["psql", TEST_DB_URL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v",
                    "role=pipeline", "-v", f"schema={schema}", "-v", f"results={table}",
                    "-f", str(ROOT / "sql" / "grants" / "pipeline_role.sql")],
                   check=True, capture_output=True)


def init_db(settings: Settings) -> Settings:
    """As deployed: the owner applies the schema (what `pipeline init-db` does) and grants
    the job's role; the settings returned run the job as that role. Settings pointing at
    another database (a private stack) keep their URL."""
    from dataclasses import replace

    from pipeline.sinks import for_settings
    from pipeline.store import Store

    owner = replace(settings, database_url=TEST_DB_URL) if settings.database_url in (
        TEST_DB_URL, job_db_url()) else settings
    store = Store(owner)
    try:
        store.schema.init_db([for_settings(owner)])
    finally:
        store.close()
    if owner is settings:
        return settings
    grant_job_role(settings.schema, settings.sink.table)
    return replace(settings, database_url=job_db_url())


def init_cli(config: Path | str) -> None:
    """`pipeline init-db` of a config file as the owner, then the job role's grants."""
    r = cli_here("init-db", "--config", str(config),
                 env={"PIPELINE__DATABASE__URL": TEST_DB_URL})
    assert r.returncode == 0, r.stderr[-2000:]
    doc = tomllib.loads(Path(config).read_text())
    grant_job_role(doc.get("database", {}).get("schema", "public"), doc["sink"]["table"])


def write_config(path: Path, settings_doc: str) -> Path:
    path.write_text(settings_doc)
    return path


def query(sql: str, params=None, db_url: str = TEST_DB_URL) -> list[tuple]:
    with psycopg.connect(db_url, autocommit=True) as conn:
        return conn.execute(sql, params).fetchall()


def stored_offsets(pipeline: str, db_url: str = TEST_DB_URL) -> dict[tuple[str, int], int]:
    return {(t, p): o for t, p, o in query(
        'SELECT topic, "partition", next_offset FROM pipeline_offsets WHERE pipeline = %s',
        (pipeline,), db_url)}


def result_keys(table: str, db_url: str = TEST_DB_URL) -> list[tuple[str, int, int]]:
    return query(f'SELECT topic, "partition", "offset" FROM {table} ORDER BY 1, 2, 3',
                 db_url=db_url)


def cli_environ(env: dict | None = None) -> dict[str, str]:
    """The CLI's environment: this process's, without what would override a test's config
    file (PRODUCT_ENV), plus ``env``."""
    return {**without_product_env(os.environ), **(env or {})}


def product_env(name: str) -> bool:
    """Whether the job reads environment variable ``name`` as a setting (pipeline/
    settings/env.py: PIPELINE__<TABLE>__<KEY>, and the old PIPELINE_DATABASE_URL and
    KAFKA_BOOTSTRAP_SERVERS, which it warns about)."""
    return name.upper().startswith("PIPELINE__") or name in (
        "PIPELINE_DATABASE_URL", "KAFKA_BOOTSTRAP_SERVERS")


def without_product_env(env) -> dict[str, str]:
    return {k: v for k, v in env.items() if not product_env(k)}


def run_cli(*args: str, env: dict | None = None, timeout: float = 300,
            new_session: bool = True) -> subprocess.CompletedProcess:
    """The real CLI in its own process (and process group, so a fault can kill it all)."""
    full_env = cli_environ(env)
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, env=full_env,
                          capture_output=True, text=True, timeout=timeout,
                          start_new_session=new_session)


# Read when their module is imported or by a new JVM: a command run in this process cannot
# honour them, so cli_here refuses them (run_cli starts a process that does).
NOT_IN_PROCESS = ("PIPELINE_FAULT", "PIPELINE_SPARK_MASTER", "PYSPARK_SUBMIT_ARGS")


def shared_spark():
    """The test process's one Spark (conftest's ``spark`` fixture), started as a run starts
    it (spark/session.py), with Spark SQL on it: every in-process run shares its JVM."""
    from pyspark.sql import SparkSession

    from pipeline.spark.session import get_context

    get_context("local[2]")
    return SparkSession.builder.getOrCreate()


# The commands that may start Spark: in this process, on the shared one.
SPARK_COMMANDS = ("run", "backfill", "verify", "dead-letters")


def cli_here(*args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The CLI's ``main`` in this process: the same parsing, settings, driver, ``error:``
    line and exit code as ``run_cli``, on the test process's shared Spark (``shared_spark``)
    instead of a new Python and driver JVM (about 6 CPU-s a run on two cores). For tests
    whose subject is not the process itself; those that need a new process (signals,
    kills, PIPELINE_FAULT, the exit of the JVM, a new JVM's [spark] settings, spark-submit,
    exactly what reaches the file descriptors) keep ``run_cli``."""
    import contextlib
    import io
    import logging

    from pipeline.cli import main

    env = env or {}
    refused = sorted(k for k in env if k in NOT_IN_PROCESS)
    assert not refused, f"{refused} cannot take effect in this process: use run_cli"
    if any(a in SPARK_COMMANDS for a in args[:2]) and "--dry-run" not in args:
        shared_spark()
    saved = dict(os.environ)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    out, err = io.StringIO(), io.StringIO()
    try:
        os.environ.clear()
        os.environ.update(cli_environ(env))
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main([str(a) for a in args])
            except SystemExit as e:  # argparse: --help, a usage error
                code = e.code if isinstance(e.code, int) else 2
    finally:
        os.environ.clear()
        os.environ.update(saved)
        for handler in [h for h in root.handlers if h not in handlers]:
            root.removeHandler(handler)
        root.setLevel(level)
    return subprocess.CompletedProcess(["pipeline", *args], code, out.getvalue(),
                                       err.getvalue())


def toml_config(settings_name: str, topics: list[str], *, fmt: str = "json",
                bootstrap: str = BOOTSTRAP, db_url: str | None = None, extra_kafka: str = "",
                extra_sink: str = "") -> str:
    """A config file's text; the database is the job role's URL unless ``db_url``."""
    db_url = db_url or job_db_url()
    cols = "".join(f'{k} = "{v}"\n' for k, v in JSON_COLUMNS.items()) if fmt == "json" else ""
    return f"""
[pipeline]
name = "{settings_name}"
[kafka]
bootstrap_servers = "{bootstrap}"
topics = {topics!r}
timeout_seconds = 10
{extra_kafka}
[database]
url = "{db_url}"
[sink]
format = "{fmt}"
table = "{settings_name}"
max_bad_records = -1
{extra_sink}
{"[sink.columns]" if fmt == "json" else ""}
{cols}
[spark]
master = "local[2]"
""".replace("'", '"')


def order(i: int, **fields) -> bytes:
    """An order record as the JSON tests' columns (JSON_COLUMNS) read it."""
    return json.dumps({"order_id": i, "customer": f"c{i}", "amount": 1.5, **fields}).encode()


def wait_until(predicate, what: str, timeout: float = 30):
    """Polls ``predicate``; a transient Kafka error (a new partition with no leader yet)
    counts as not yet, as a run would retry it (exit 75)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            value = predicate()
        except TransientError:
            value = None
        if value:
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


def delete_records(topic: str, partition: int, before: int) -> None:
    client = admin()
    [f] = client.delete_records([TopicPartition(topic, partition, before)]).values()
    f.result()
    wait_until(lambda: watermark_low(topic, partition) == before, "the deletion")


def watermark_low(topic: str, partition: int) -> int:
    return watermarks(topic)[partition][0]


def recreate_topic(topic: str, partitions: int) -> None:
    client = admin()
    client.delete_topics([topic])[topic].result()
    wait_until(lambda: topic not in client.list_topics(timeout=5).topics, "the deletion")

    def created() -> bool:
        try:
            create_topic(topic, partitions)
            return True
        except Exception:  # noqa: BLE001 - still marked for deletion: try again
            return False

    wait_until(created, "the topic to be created again")
