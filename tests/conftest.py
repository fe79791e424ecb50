"""Integration tests run against the real local stack (scripts/stack up): one broker, one
Postgres, and one SparkSession per test session. Unit tests need none of it.

Under pytest-xdist (scripts/test: `-n N --dist loadgroup`) every worker is its own test
session: its own SparkSession, its own database (tests/helpers.py: TEST_DB_URL,
pipeline_test_gw0, ...) and, as always, its own topics (unique names). The stack is
brought up once per run (the first worker that needs it; the others wait on a lock). What
tests share beyond that runs on one worker, in turn (SHARED below)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import socket
import subprocess
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.helpers import (
    BOOTSTRAP,
    CREATED_TOPICS,
    ROOT,
    TEST_DB_NAME,
    TEST_DB_URL,
    admin,
    make_url,
    product_env,
    shared_spark,
)

os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
# What this process's subprocesses (bench peers, scripts) take as the test database: this
# worker's own.
os.environ["PIPELINE_TEST_DATABASE_URL"] = TEST_DB_URL
STACK_DIR = Path(os.environ.get("STACK_DIR") or ROOT / ".stack")

# Tests that share something beyond their own topics, tables and SparkSession: each group
# runs on one xdist worker, its tests in turn (--dist loadgroup), beside the other workers.
# A test joins a group by the fixtures it uses, so a new test written the usual way joins
# the right one. Why each is shared:
SHARED = {
    # The stack's one Schema Registry: test_registry restarts it and test_avro_registry
    # stops it, under any other test using it; the CDC chain's Kafka Connect writes Avro
    # through it, and its fixtures reset Connect, the source Postgres and shop_* topics.
    "registry": {"registry", "cdc_chain"},
    # The one standalone cluster (fixed ports): its tests kill and restart its workers, and
    # scripts/package rewrites dist/pipeline-env.tar.gz, which the cluster jobs ship.
    "cluster": {"cluster", "job_archive"},
}
# The soaks kill only their own runs' process groups, but each keeps two cores busy for
# minutes: one at a time.
SOAKS = "tests/integration/test_soak.py"
# No test depends on its caller's environment: the variables the job reads as settings
# (PIPELINE__*, and the old names it warns about) are gone for the whole session, after
# tests/helpers.py took where the test broker and database are. A test that means to set
# one does so itself (monkeypatch, or run_cli's env).
for _name in [n for n in os.environ if product_env(n)]:
    del os.environ[_name]


def pytest_configure(config):
    config.addinivalue_line(
        "markers", "spark_line: also run on the second Spark line (3.5): scripts/test runs "
        "these again with .venv-spark35 beside the whole suite on the default line")
    # pytest-xdist's own marker, declared here too so that `-p no:xdist` still runs.
    config.addinivalue_line(
        "markers", "xdist_group(name): tests of one group run on one xdist worker, in turn")


# First: the groups must be set before xdist's own hook looks for them.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    for item in items:
        if any(f"/{d}/" in str(item.fspath) for d in ("integration", "airflow", "security", "cdc")):
            item.add_marker(pytest.mark.integration)
        group = xdist_group(item)
        if group:
            item.add_marker(pytest.mark.xdist_group(group))
    if hasattr(config, "workerinput"):  # an xdist worker: every worker sorts alike
        longest_first(items)
        if getattr(config.option, "loadgroup", False):
            group_node_ids(items)


def group_node_ids(items) -> None:
    """What xdist's --dist loadgroup does on a worker, done here: a test's group is the
    suffix '@group' of the node id the controller schedules by. xdist 3.8 writes it into
    item._nodeid, which pytest 9.2 no longer reads (the id is item._id), so without this
    every group would be spread over the workers."""
    from _pytest.nodeid import NodeId

    for item in items:
        mark = item.get_closest_marker("xdist_group")
        if mark and "@" not in item.nodeid:
            item._id = NodeId.parse(f"{item.nodeid}@{mark.args[0]}")


def longest_first(items) -> None:
    """xdist hands work out in collection order (scripts/test: --no-loadscope-reorder):
    files with a slow test first, then the groups, then the other integration tests, the
    unit tests last, so the long ones start at once and the short ones fill the end. A
    file stays in one piece (its module fixtures are made once)."""
    def rank(item) -> int:
        if item.get_closest_marker("slow"):
            return 0
        if item.get_closest_marker("xdist_group"):
            return 1
        return 3 if item.nodeid.startswith("tests/unit/") else 2

    files: dict[str, int] = {}
    for item in items:
        path = item.nodeid.split("::", 1)[0]
        files[path] = min(files.get(path, 9), rank(item))
    items.sort(key=lambda item: files[item.nodeid.split("::", 1)[0]])  # stable


def xdist_group(item) -> str | None:
    """The worker-sharing group of ``item``: SHARED by its fixtures, the soaks together,
    else its file when the file has fixtures of a wider scope (a module's data, a second
    stack: made once on one worker rather than once per worker); None: any worker."""
    names = set(item.fixturenames)
    for group, fixtures in SHARED.items():
        if names & fixtures:
            return group
    path = item.nodeid.split("::", 1)[0]
    if path == SOAKS:
        return "soak"
    defs = getattr(item, "_fixtureinfo", None)
    if defs is not None and any(d[-1].scope != "function" and d[-1].baseid == path
                                for d in defs.name2fixturedefs.values()):
        return path
    return None


@contextlib.contextmanager
def stack_lock():
    """One pytest process of the stack at a time (xdist workers, scripts/test's passes)
    brings up what they share."""
    STACK_DIR.mkdir(parents=True, exist_ok=True)
    with open(STACK_DIR / "pytest.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


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
    """Brings the stack up (idempotent; fast when it is up already), once per run: a run of
    several pytest processes (xdist workers; scripts/test's passes, PIPELINE_TEST_RUN)
    does it in the first that needs it, since `up` also rewrites what the others use (the
    SCRAM credentials, pg_hba.conf). Then the database this process owns (TEST_DB_NAME)."""
    run = os.environ.get("PIPELINE_TEST_RUN") or os.environ.get("PYTEST_XDIST_TESTRUNUID")
    done = STACK_DIR / "pytest-run"
    with stack_lock():
        if not run or not done.exists() or done.read_text() != run:
            subprocess.run([str(ROOT / "scripts" / "stack"), "up"], check=True)
            if run:
                done.write_text(run)
        create_database(TEST_DB_NAME)
    return {"bootstrap": BOOTSTRAP, "db_url": TEST_DB_URL}


def create_database(name: str) -> None:
    """As scripts/stack does for pipeline_test: an empty database (the job role's grants
    are per schema: grant_job_role)."""
    server = make_url(TEST_DB_URL).set(database="postgres").render_as_string(False)
    with psycopg.connect(server, autocommit=True) as conn:
        if not conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone():
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


@pytest.fixture(autouse=True)
def _stack_for_integration(request):
    """Every integration test has the stack and its own database, whether or not it names
    the fixture (a worker's database exists only once its session made it); a broker that
    died meanwhile stops the run with its own last words, not a cascade of refusals."""
    if request.node.get_closest_marker("integration"):
        request.getfixturevalue("stack")
        broker_alive_or_exit()


def broker_alive_or_exit() -> None:
    host, port = BOOTSTRAP.rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=5).close()
    except OSError as e:
        report = broker_gone_report(e)
        # scripts/test prints this file last: a long log's end is where CI shows it.
        run = os.environ.get("PIPELINE_TEST_RUN", "")
        (STACK_DIR / "broker-gone.txt").write_text(f"run {run}\n{report}\n")
        pytest.exit(report, returncode=3)


def broker_gone_report(error: OSError) -> str:
    """What a reader needs to tell a full disk, the kernel's OOM killer and a crashed JVM
    apart, from a CI log alone."""
    log = STACK_DIR / "kafka" / "kafka.log"
    tail = log.read_text(errors="replace").splitlines()[-15:] if log.exists() else []
    disk = shutil.disk_usage(STACK_DIR)
    meminfo = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
    crashes = sorted(str(p) for p in (STACK_DIR / "kafka").glob("hs_err_pid*.log"))
    return (f"the suite's broker at {BOOTSTRAP} is gone ({error}); {disk.free >> 20} MB free "
            f"under {STACK_DIR}; MemAvailable {meminfo['MemAvailable'].strip()}; "
            f"JVM crash reports: {crashes or 'none'}; the end of {log}:\n" + "\n".join(tail))


@pytest.fixture(scope="module", autouse=True)
def _topics_of_the_module_deleted(request):
    """A tests/integration module's topics go when it ends (helpers.CREATED_TOPICS): the
    suite's disk then holds one module's records at a time. Elsewhere session fixtures
    make topics (tests/security, tests/airflow) that later modules use: kept."""
    start = len(CREATED_TOPICS)
    yield
    if ("integration" not in Path(str(request.node.path)).parts
            or os.environ.get("PIPELINE_TEST_KEEP_TOPICS")):
        return
    # Once each: a topic a test recreated is listed twice, and a delete request naming a
    # topic twice is refused, its dropped future's callback then crashed the process.
    mine = list(dict.fromkeys(CREATED_TOPICS[start:]))
    del CREATED_TOPICS[start:]
    if mine:
        try:
            client = admin()  # alive until its futures resolve (else they never do)
            futures = client.delete_topics(mine, operation_timeout=30, request_timeout=60)
            for f in futures.values():
                with contextlib.suppress(Exception):  # gone already (a test deleted it)
                    f.result(timeout=90)
        except Exception as e:  # noqa: BLE001 - cleanup never fails a test
            print(f"could not delete {len(mine)} topics of the module: {e}")


@pytest.fixture(scope="session")
def registry() -> str:
    """The stack's Schema Registry (scripts/registry up: idempotent, fetches Apicurio once);
    its Confluent-compatible API's URL."""
    with stack_lock():
        subprocess.run([str(ROOT / "scripts" / "registry"), "up"], check=True)
    return f"http://127.0.0.1:{os.environ.get('REGISTRY_PORT', '8381')}/apis/ccompat/v7"


@pytest.fixture(scope="session")
def spark(stack):
    """The test session's one Spark, started as a run starts it (spark/session.py), with
    Spark SQL on it; an in-process run before this fixture shares its JVM."""
    session = shared_spark()
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
