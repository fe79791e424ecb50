"""The job on a real Spark standalone cluster (scripts/cluster: a master and two 1-core
workers, each in a mount namespace where the repository does not exist), with the job's
Python environment shipped as an archive (scripts/package). Every run is a fresh driver
process: the test session's own SparkContext is local and cannot be reused."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
from datetime import datetime
from decimal import Decimal
from pathlib import Path

import pytest

from pipeline.sample import order
from tests.cluster.conftest import (
    STATE_DIR,
    WORKERS,
    app_dirs,
    cluster_command,
    workers_with_tasks,
)
from tests.helpers import (
    ROOT,
    TEST_DB_URL,
    create_topic,
    init_db,
    make_settings,
    produce_orders,
    query,
    run_cli,
    stored_offsets,
    toml_config,
    unique,
    watermarks,
)

pytestmark = pytest.mark.integration

PARTITIONS = 3
PER_PARTITION = 150
VENV_BIN = ROOT / ".venv" / "bin"


def driver_env() -> dict[str, str]:
    """The submitting machine's environment as scripts/test leaves it: PYSPARK_PYTHON is
    the repository's venv, which the workers cannot see; nothing on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update({"SPARK_LOCAL_IP": "127.0.0.1", "PYSPARK_PYTHON": str(VENV_BIN / "python"),
                "PATH": f"{VENV_BIN}:{env.get('PATH', '')}"})
    return env


def spark_conf_lines(master: str, archive: Path | None,
                     extra: dict[str, str] | None = None) -> str:
    """[spark] for the cluster. spark.cores.max + minRegisteredResourcesRatio: the first
    tasks wait until both executors are registered (see SPREAD for when that is not
    enough). ``extra``: more [spark.conf] keys (e.g. spark.executorEnv.PIPELINE_FAULT)."""
    conf = {"spark.driver.host": "127.0.0.1", "spark.cores.max": str(WORKERS),
            "spark.scheduler.minRegisteredResourcesRatio": "1.0",
            "spark.executor.memory": "1g"}
    if archive is not None:
        conf.update({"spark.archives": f"{archive}#job",
                     "spark.pyspark.python": "./job/bin/python",
                     # docs/cluster.md: the packed env has pipeline, so its daemon
                     "spark.python.daemon.module": "pipeline.executor.daemon"})
    conf.update(extra or {})
    return f'[spark]\nmaster = "{master}"\n[spark.conf]\n' + "".join(
        f'"{k}" = "{v}"\n' for k, v in conf.items())


def setup_pipeline(tmp_path: Path, master: str, archive: Path | None, *,
                   per_partition: int = PER_PARTITION, extra: dict[str, str] | None = None):
    """A fresh topic with PARTITIONS x per_partition orders, its tables and a config file.
    Returns (name, topic, config path, order ids per partition in offset order)."""
    name, topic = unique("cl"), unique("cl_orders")
    create_topic(topic, PARTITIONS)
    ids = {p: list(range(p * 1_000_000, p * 1_000_000 + per_partition))
           for p in range(PARTITIONS)}
    for p, part_ids in ids.items():
        produce_orders(topic, part_ids, partition=p)
    init_db(make_settings(name, [topic]))
    path = tmp_path / f"{name}.toml"
    write_config(path, name, topic, master, archive, extra)
    return name, topic, path, ids


def write_config(path: Path, name: str, topic: str, master: str, archive: Path | None,
                 extra: dict[str, str] | None = None) -> Path:
    # As the owner: the job role's TLS needs the CA file on every executor, and the workers
    # cannot see this repository's .stack/tls (shipping it with --files is not built yet).
    text = toml_config(name, [topic], db_url=TEST_DB_URL).replace(
        '[spark]\nmaster = "local[2]"\n', spark_conf_lines(master, archive, extra))
    assert "local[2]" not in text
    path.write_text(text)
    return path


def expected_rows(topic: str, ids: dict[int, list[int]]) -> list[tuple]:
    """What was produced, as the results table must hold it (offsets in production order)."""
    rows = []
    for p, part_ids in ids.items():
        for offset, i in enumerate(part_ids):
            doc = json.loads(order(i))
            rows.append((topic, p, offset, doc["order_id"], doc["customer"],
                         Decimal(str(doc["amount"])), datetime.fromisoformat(doc["placed_at"])))
    return sorted(rows)


def assert_landed_exactly(name: str, topic: str, ids: dict[int, list[int]]) -> None:
    got = query(f'SELECT topic, "partition", "offset", order_id, customer, amount, placed_at '
                f'FROM {name} ORDER BY 1, 2, 3')
    expected = expected_rows(topic, ids)
    if got != expected:  # not `assert ==`: pytest's diff of 75,000 tuples runs for hours
        first = next((g, e) for g, e in itertools.zip_longest(got, expected) if g != e)
        pytest.fail(f"{name}: {len(got)} rows, {len(expected)} expected; first difference "
                    f"(got, expected): {first}")
    high = {p: hi for p, (_lo, hi) in watermarks(topic).items()}
    assert high == {p: len(v) for p, v in ids.items()}
    assert stored_offsets(name) == {(topic, p): hi for p, hi in high.items()}


def summary(stdout: str) -> dict:
    return json.loads(stdout.strip().splitlines()[-1])


def assert_run_exact(done, name: str, topic: str, ids: dict[int, list[int]],
                     before: dict[int, set[Path]]) -> None:
    """The run succeeded, counted every record once, landed exactly what was produced, and
    ran tasks on every worker."""
    assert done.returncode == 0, done.stderr[-3000:]
    result = summary(done.stdout)
    total = PARTITIONS * PER_PARTITION
    assert (result["status"], result["records_read"], result["rows_written"]) == \
        ("succeeded", total, total)
    assert_landed_exactly(name, topic, ids)
    assert workers_with_tasks(before) == set(range(1, WORKERS + 1))


def run_cli_submit(master: str, archive: Path, config: Path):
    """spark-submit in client mode, the environment shipped with --archives."""
    cmd = [str(VENV_BIN / "spark-submit"), "--master", master,
           "--archives", f"{archive}#job",
           "--conf", "spark.pyspark.python=./job/bin/python",
           # Without it spark-submit also starts the driver with spark.pyspark.python.
           "--conf", f"spark.pyspark.driver.python={sys.executable}",
           str(ROOT / "pipeline" / "submit.py"), "run", "--config", str(config), "--json"]
    return subprocess.run(cmd, cwd=ROOT, env=driver_env(), capture_output=True, text=True,
                          timeout=300, start_new_session=True)


# A registered executor takes tasks only once it has unpacked the shipped environment
# (~150 MB). On a loaded machine one worker's executor was ready ~4 s before the other's and
# ran both of a small run's tasks (CI, 2026-11-26): each task now holds its executor a while
# after its first batch, so the other executor takes the second task.
SPREAD = {"spark.executorEnv.PIPELINE_FAULT": "during_read:sleep=20"}


def test_spark_submit_to_the_cluster_lands_every_record_once(cluster, job_archive, tmp_path):
    name, topic, config, ids = setup_pipeline(tmp_path, cluster, archive=None, extra=SPREAD)
    before = app_dirs()
    done = run_cli_submit(cluster, job_archive, config)
    assert_run_exact(done, name, topic, ids, before)


def test_pipeline_run_with_a_cluster_master_lands_every_record_once(cluster, job_archive,
                                                                    tmp_path):
    """Client mode without spark-submit: [spark] master = "spark://..." and the archive
    in [spark.conf]."""
    name, topic, config, ids = setup_pipeline(tmp_path, cluster, archive=job_archive,
                                              extra=SPREAD)
    before = app_dirs()
    done = run_cli("run", "--config", str(config), "--json", env=driver_env())
    assert_run_exact(done, name, topic, ids, before)


def error_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("error:")]


@pytest.mark.parametrize("driver_python", ["repo venv", "none"])
def test_without_the_shipped_environment_the_run_fails_and_commits_nothing(
        cluster, tmp_path, driver_python):
    """The workers cannot see the repository's .venv. With PYSPARK_PYTHON naming it (as
    scripts/test and `scripts/stack env` set it) every task fails with 'Cannot run program
    "<repo>/.venv/bin/python": error=2'; with no PYSPARK_PYTHON the workers' own python3
    runs and fails with "ModuleNotFoundError: No module named 'pipeline'". Both are a
    configuration problem (exit 2) whose one error line says how to ship the environment."""
    name, topic, config, _ids = setup_pipeline(tmp_path, cluster, archive=None)
    env = driver_env()
    if driver_python == "none":
        del env["PYSPARK_PYTHON"]
    # The whole environment, not merged into this process's (which may have PYSPARK_PYTHON).
    done = subprocess.run([sys.executable, "-m", "pipeline", "run", "--config", str(config)],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300,
                          start_new_session=True)
    assert done.returncode == 2, (done.returncode, done.stderr[-3000:])
    [error] = error_lines(done.stderr)
    assert "scripts/package" in error, error
    if driver_python == "none":
        assert "'pipeline'" in error, error
    else:
        assert str(VENV_BIN / "python") in error, error
    assert query(f"SELECT count(*) FROM {name}") == [(0,)]
    assert stored_offsets(name) == {}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_a_master_that_cannot_be_reached_is_one_error_and_exit_75(stack, tmp_path):
    """A wrong master URL (or a master that is down): one error line naming it, exit 75
    (transient: the cluster may come back), at once rather than after Spark's minute of
    retries; nothing read, nothing committed. Needs no cluster."""
    master = f"spark://127.0.0.1:{free_port()}"
    name, _topic, config, _ids = setup_pipeline(tmp_path, master, archive=None,
                                                per_partition=5)
    t0 = time.monotonic()
    done = run_cli("run", "--config", str(config), env=driver_env(), timeout=120)
    elapsed = time.monotonic() - t0
    assert done.returncode == 75, (done.returncode, done.stderr[-3000:])
    [error] = error_lines(done.stderr)
    assert master in error, error
    assert elapsed < 30, f"{elapsed:.1f} s"
    assert query(f"SELECT count(*) FROM {name}") == [(0,)]
    assert stored_offsets(name) == {}


# ---- failures on the cluster while a run reads -----------------------------------------
# PIPELINE_FAULT=<point>:sleep=N (pipeline/faults.py) reaches the executors' Python workers
# through spark.executorEnv; each prints "fault injection: sleeping at <point>" to its
# stderr, which the worker writes to work/<app id>/<executor id>/stderr. That is when a test
# kills something: the task is then provably inside the read or right after its commit.
FAULT_SLEEP = 6
KILL_PER_PARTITION = 25_000  # > consume.BATCH: the during_read fault lands mid-range


def runs_of(name: str) -> list[tuple]:
    return query("SELECT kind, status, records_read, rows_written, dead_letters, exit_code "
                 "FROM pipeline_runs WHERE pipeline = %s ORDER BY run_id", (name,))


class Background:
    """`pipeline run --json` in its own process group; output in files (a pipe could fill
    up with Spark's warnings while the test waits for something else)."""

    def __init__(self, config: Path, tmp_path: Path):
        self.out = (tmp_path / "run.stdout").open("w+")
        self.err = (tmp_path / "run.stderr").open("w+")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "pipeline", "run", "--config", str(config), "--json"],
            cwd=ROOT, env=driver_env(), stdout=self.out, stderr=self.err, text=True,
            start_new_session=True)

    def wait(self, timeout: float = 240) -> tuple[int, str, str]:
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
            raise
        finally:
            self.out.seek(0)
            self.err.seek(0)
        return code, self.out.read(), self.err.read()

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.out.close()
        self.err.close()


def wait_for_fault(before: dict[int, set[Path]], point: str, proc: subprocess.Popen,
                   timeout: float = 120) -> tuple[int, Path]:
    """(worker number, executor folder) of the first executor of the new application whose
    task reached the fault point."""
    line = f"fault injection: sleeping at {point}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the run ended before any task reached the fault point"
        for n, dirs in app_dirs().items():
            for app in dirs - before[n]:
                for stderr in sorted(app.glob("*/stderr")):
                    if line in stderr.read_text(errors="replace"):
                        return n, stderr.parent
        time.sleep(0.1)
    raise AssertionError(f"no executor reached {point} within {timeout} s")


def process_args(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


def executor_pid(executor_dir: Path) -> int:
    """The executor JVM of <work>/<app id>/<executor id>: its command line names both."""
    app, executor = executor_dir.parent.name, executor_dir.name
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        args = process_args(int(entry.name))
        if ("org.apache.spark.executor.CoarseGrainedExecutorBackend" in args
                and app in args and "--executor-id" in args
                and args[args.index("--executor-id") + 1] == executor):
            return int(entry.name)
    raise AssertionError(f"no executor process for {executor_dir}")


def worker_pid(n: int) -> int:
    """worker-N's Worker JVM (scripts/cluster's pid file; its command line says so)."""
    pid = int((STATE_DIR / f"worker-{n}.pid").read_text())
    assert "org.apache.spark.deploy.worker.Worker" in process_args(pid), process_args(pid)
    return pid


def wait_gone(pid: int, timeout: float = 10) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        # A zombie until its parent reaps it: dead all the same.
        stat = Path(f"/proc/{pid}/stat")
        if stat.exists() and stat.read_text().rsplit(")", 1)[1].split()[0] == "Z":
            return
        time.sleep(0.05)
    raise AssertionError(f"process {pid} still alive after SIGKILL")


def executor_logs(before: dict[int, set[Path]]) -> str:
    """The stderr of every executor of the application(s) started since `before`."""
    return "".join(f.read_text(errors="replace") for n, dirs in app_dirs().items()
                   for app in dirs - before[n] for f in sorted(app.glob("*/stderr")))


def assert_counted_once(name: str, result: dict, total: int) -> None:
    """The --json summary and the run row count each record once, although a task ran
    twice."""
    assert (result["status"], result["records_read"], result["rows_written"],
            result["dead_letters"]) == ("succeeded", total, total, 0), result
    assert runs_of(name) == [("ingest", "succeeded", total, total, 0, 0)]


@pytest.mark.parametrize("point", ["during_read", "after_task_commit"])
def test_an_executor_killed_mid_run_is_replaced_and_every_record_counted_once(
        cluster, job_archive, tmp_path, point):
    """SIGKILL of one executor JVM while its task stages: Spark reruns the task (on the
    other executor or on the one its worker starts instead) and the run succeeds exactly.
    during_read: the task is inside its staging COPY, rows sent but not committed.
    after_task_commit: its first attempt has committed its rows to the staging table and
    Spark has not yet heard of it; the rerun stages the same rows again and the publisher
    must use one attempt only."""
    name, topic, config, ids = setup_pipeline(
        tmp_path, cluster, job_archive, per_partition=KILL_PER_PARTITION,
        extra={"spark.executorEnv.PIPELINE_FAULT": f"{point}:sleep={FAULT_SLEEP}"})
    before = app_dirs()
    run = Background(config, tmp_path)
    try:
        _n, executor_dir = wait_for_fault(before, point, run.proc)
        victim = executor_pid(executor_dir)
        os.kill(victim, signal.SIGKILL)
        wait_gone(victim)
        code, out, err = run.wait()
    finally:
        run.stop()
    assert code == 0, err[-4000:]
    # Spark saw that executor go with the task it was running (the one that reached the
    # fault point: one core, one task at a time) and ran that task again to the end. With
    # after_task_commit, both attempts of it have therefore committed their rows.
    lost = re.findall(r"Lost task (\d+)\.0 in stage \S+ \(TID \d+\) \(\S+ executor (\d+)\): "
                      r"ExecutorLostFailure", err)
    assert [e for _task, e in lost] == [executor_dir.name], err[-4000:]
    task_index = lost[0][0]
    assert re.search(rf"Finished task {task_index}\.1 in stage", executor_logs(before)), lost
    total = PARTITIONS * KILL_PER_PARTITION
    assert_counted_once(name, summary(out), total)
    assert_landed_exactly(name, topic, ids)


def test_a_worker_lost_mid_run_leaves_an_exact_result_or_nothing(cluster, job_archive,
                                                                 tmp_path):
    """A whole worker dies mid-read (its Worker JVM and its executor SIGKILLed, as when a
    host goes away): the run either succeeds exactly on the worker that is left or exits
    75 with nothing committed; either way a rerun leaves Kafka's records in Postgres
    exactly once. The worker is started again afterwards (scripts/cluster up)."""
    name, topic, config, ids = setup_pipeline(
        tmp_path, cluster, job_archive, per_partition=KILL_PER_PARTITION,
        extra={"spark.executorEnv.PIPELINE_FAULT": f"during_read:sleep={FAULT_SLEEP}"})
    total = PARTITIONS * KILL_PER_PARTITION
    before = app_dirs()
    run = Background(config, tmp_path)
    try:
        n, executor_dir = wait_for_fault(before, "during_read", run.proc)
        victims = [worker_pid(n), executor_pid(executor_dir)]
        for pid in victims:
            os.kill(pid, signal.SIGKILL)
        for pid in victims:
            wait_gone(pid)
        code, out, err = run.wait()
    finally:
        run.stop()
        up = cluster_command("up")  # later tests need both workers
        assert up.returncode == 0, up.stderr
    assert code in (0, 75), (code, err[-4000:])
    if code == 0:
        assert_counted_once(name, summary(out), total)
    else:
        assert len(error_lines(err)) == 1, err[-4000:]
        assert query(f"SELECT count(*) FROM {name}") == [(0,)]
        assert stored_offsets(name) == {}
    # The rerun, on the whole cluster again and without the fault: a no-op after a
    # success, the whole topic after a failure.
    write_config(config, name, topic, cluster, job_archive)
    again = run_cli("run", "--config", str(config), "--json", env=driver_env())
    assert again.returncode == 0, again.stderr[-4000:]
    assert summary(again.stdout)["status"] == ("noop" if code == 0 else "succeeded")
    assert_landed_exactly(name, topic, ids)
