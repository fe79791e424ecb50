"""The DAGs under Airflow's own scheduler, as deployed: scripts/airflow-scheduler starts the
scheduler (LocalExecutor), the dag-processor and the api-server on a Postgres metadata
database; the test talks to Airflow only through the REST API (/api/v2, a token from the
simple auth manager). The pipeline's Kafka broker is the test's own, stopped and started
with scripts/stack.

The ingest DAG runs on its own schedule (@continuous, from the config's [airflow] table);
Kafka goes away for a while, so a run fails transient and is retried until Kafka is back;
a backfill run with parameters, triggered through the API, restores rows deleted from the
results table. At the end Postgres holds exactly what Kafka holds. Every wait is bounded
and says what it waited for.

Two forms (docs/airflow.md, "Tests"). The short one, which CI runs: the records arrive in
two batches and Kafka goes away once, a few DAG runs in all. PIPELINE_TEST_SCHEDULER=full:
records keep arriving the whole time, Kafka goes away three times, each outage retried
through, and the schedule goes on until everything has landed and one run more."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from tests.airflow.conftest import Pipeline
from tests.helpers import (
    ROOT,
    TEST_DB_URL,
    create_topic,
    init_cli,
    make_settings,
    produce_orders,
    query,
    toml_config,
    unique,
)
from tests.integration._reliability import PrivateStack, assert_exactly_once

pytestmark = [pytest.mark.airflow, pytest.mark.slow]


@dataclass(frozen=True)
class Form:
    producing: bool  # records keep arriving while the DAGs run (else two batches)
    outages: int  # how many times Kafka goes away, one after another


FORMS = {"short": Form(producing=False, outages=1), "full": Form(producing=True, outages=3)}
FORM_NAME = os.environ.get("PIPELINE_TEST_SCHEDULER") or "short"

SCRIPT = ROOT / "scripts" / "airflow-scheduler"
STACK = ROOT / "scripts" / "stack"
# Short everything: the whole test has about three minutes on a 2-core machine.
AIRFLOW_TABLE = """
[airflow]
schedule = "@continuous"
retries = 8
retry_delay_seconds = 2
max_retry_delay_seconds = 4
execution_timeout_seconds = 120
"""


def free_port_pair() -> int:
    """A port p with p + 1 free too (the api-server and the task log server)."""
    for _ in range(50):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port + 1))
                return port
            except OSError:
                continue
    raise AssertionError("no two adjacent free ports")


class Api:
    """Airflow's REST API as a user scripts it: a token from POST /auth/token, then
    /api/v2 with it as a bearer token."""

    def __init__(self, url: str, username: str, password: str, home: Path) -> None:
        self.url, self.home = url, home
        self.token = self.call("POST", "/auth/token",
                               {"username": username, "password": password},
                               auth=False)["access_token"]

    def call(self, method: str, path: str, body: dict | None = None, *,
             auth: bool = True) -> Any:
        headers = {"Content-Type": "application/json"}
        if auth:
            headers["Authorization"] = f"Bearer {self.token}"
        request = urllib.request.Request(
            self.url + path, method=method, headers=headers,
            data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return json.loads(response.read() or b"null")
        except urllib.error.HTTPError as e:
            raise AssertionError(f"{method} {path}: HTTP {e.code} {e.read()[:1000]!r}") from None

    def runs(self, dag_id: str) -> list[dict]:
        return self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns?limit=100"
                         "&order_by=run_after")["dag_runs"]

    def tries(self, dag_id: str) -> list[dict]:
        """Every task instance of the DAG's runs, with its try_number and state."""
        return self.call("GET", f"/api/v2/dags/{dag_id}/dagRuns/~/taskInstances"
                         "?limit=100")["task_instances"]

    def task_log(self, ti: dict, try_number: int) -> str:
        """One attempt's task log as the API serves it (the UI's log view)."""
        path = (f"/api/v2/dags/{ti['dag_id']}/dagRuns/{quote(ti['dag_run_id'], safe='')}"
                f"/taskInstances/{ti['task_id']}/logs/{try_number}?full_content=true")
        content = self.call("GET", path)["content"]
        return "\n".join(c if isinstance(c, str) else json.dumps(c) for c in content)

    def logs(self) -> str:
        """Where to look when a wait fails: the processes' logs and the task logs."""
        return f"logs: {self.home}/*.log, task logs under {self.home}/logs"


def wait_for(what: str, check: Callable[[], Any], timeout: float, api: Api,
             every: float = 1.0) -> Any:
    """check() until it returns something truthy; fails naming ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"waited {timeout:.0f} s for {what}; {api.logs()}")
        time.sleep(every)


class Producer(threading.Thread):
    """Keeps records arriving: a few orders every second or so, paused on request (while
    Kafka is down) and stopped at the end; ids continue where the topic's setup stopped."""

    def __init__(self, topic: str, bootstrap: str, first_id: int) -> None:
        super().__init__(name="orders", daemon=True)
        self.topic, self.bootstrap, self.next_id = topic, bootstrap, first_id
        self.running, self.stopped = threading.Event(), threading.Event()
        self.running.set()
        self.producing = threading.Lock()
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stopped.wait(1.0):
                with self.producing:
                    if self.running.is_set():
                        produce_orders(self.topic, range(self.next_id, self.next_id + 3),
                                       bootstrap=self.bootstrap)
                        self.next_id += 3
        except BaseException as e:  # surfaced by the test, not lost in a thread
            self.error = e

    def pause(self) -> None:
        """Returns once no batch is in flight (the broker is about to go away)."""
        with self.producing:
            self.running.clear()

    def resume(self) -> None:
        self.running.set()

    def stop(self) -> None:
        self.stopped.set()
        self.join(timeout=60)
        assert self.error is None, f"producing failed: {self.error!r}"


@dataclass
class Scheduled:
    pipeline: Pipeline
    api: Api
    kafka: PrivateStack  # the pipeline's own broker: stopped and started by the test

    @property
    def bootstrap(self) -> str:
        return self.kafka.bootstrap


@pytest.fixture
def scheduled(stack, tmp_path):
    """Airflow started by scripts/airflow-scheduler on a config folder of the test's own,
    and in it one pipeline (20 orders, schedule @continuous) whose topic lives on a
    private broker (scripts/stack kafka-up with a STACK_DIR of its own): taking it down
    disturbs nothing else, and with one topic it restarts in seconds. Results, offsets and
    Airflow's metadata are in the stack's Postgres. Both start at once; both are stopped
    afterwards."""
    subprocess.run([str(STACK), "airflow"], check=True)  # .airflow-venv, idempotent
    configs = tmp_path / "conf"
    configs.mkdir()
    port = int(os.environ.get("AIRFLOW_PORT") or free_port_pair())
    job_bin = str(ROOT / ".venv" / "bin")
    # As in conftest.airflow: nothing of the outer environment steers Airflow or the job
    # (PIPELINE__* would override the job's config; the harness's KAFKA_BOOTSTRAP_SERVERS,
    # which the job no longer reads, would only add a warning to its log).
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("AIRFLOW", "PIPELINE_", "PYSPARK_", "SPARK_HOME", "VIRTUAL_ENV",
                                "PYTEST_", "KAFKA_BOOTSTRAP_SERVERS"))}
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep)
                                  if p != job_bin)
    env.update(AIRFLOW_PORT=str(port), PIPELINE_CONFIG_DIR=str(configs))
    t0 = time.monotonic()
    up = subprocess.Popen([str(SCRIPT), "up"], env=env, text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT)
    kafka = PrivateStack()
    try:
        kafka.stack("kafka-up")
        name = unique("af_sched")
        create_topic(name, 2, bootstrap=kafka.bootstrap)
        produce_orders(name, range(20), bootstrap=kafka.bootstrap)
        config = configs / f"{name}.toml"
        # Kafka's metadata timeout 5 s instead of 10: a run fails sooner while it is away.
        config.write_text(toml_config(name, [name], bootstrap=kafka.bootstrap).replace(
            "timeout_seconds = 10", "timeout_seconds = 5") + AIRFLOW_TABLE)
        init_cli(config)
        output, _ = up.communicate(timeout=300)
        assert up.returncode == 0, f"scripts/airflow-scheduler up failed:\n{output[-4000:]}"
        print(f"private Kafka, pipeline and scripts/airflow-scheduler up: "
              f"{time.monotonic() - t0:.1f} s")
        settings = dict(line.removeprefix("export ").split("=", 1) for line in subprocess.run(
            [str(SCRIPT), "env"], env=env, check=True, capture_output=True,
            text=True).stdout.splitlines())
        api = Api(settings["AIRFLOW_API_URL"], settings["AIRFLOW_API_USERNAME"],
                  settings["AIRFLOW_API_PASSWORD"], Path(settings["AIRFLOW_HOME"]))
        yield Scheduled(Pipeline(name, config), api, kafka)
    finally:
        if up.poll() is None:
            up.kill()
        down = subprocess.Popen([str(SCRIPT), "down"], env=env)  # both at once
        kafka.destroy()
        down.wait(timeout=120)


# Task states that still run or will run (a paused DAG's "scheduled" tasks are not queued).
ACTIVE = {"queued", "running", "up_for_retry", "up_for_reschedule", "restarting", "deferred"}


def succeeded_ingests(pipeline: Pipeline) -> list[tuple]:
    return query("SELECT run_id, records_read FROM pipeline_runs WHERE pipeline = %s AND "
                 "kind = 'ingest' AND status = 'succeeded' AND records_read > 0 "
                 "ORDER BY run_id", (pipeline.name,))


def retried_tries(api: Api, dag_id: str) -> list[dict]:
    """Task instances that failed at least once: up for retry, or on a later try."""
    return [ti for ti in api.tries(dag_id)
            if ti["state"] == "up_for_retry" or ti["try_number"] >= 2]


def test_scheduler_runs_the_dags_through_an_outage_and_a_backfill(scheduled):
    assert FORM_NAME in FORMS, (
        f"PIPELINE_TEST_SCHEDULER={FORM_NAME!r}: use one of {', '.join(FORMS)}")
    form = FORMS[FORM_NAME]
    pipeline, api = scheduled.pipeline, scheduled.api
    t0 = time.monotonic()
    ingest, backfill = pipeline.ingest, pipeline.backfill

    def phase(name: str) -> None:
        print(f"{time.monotonic() - t0:6.1f} s  {name}")

    # The dag-processor has parsed the config folder; DAGs start paused, as deployed.
    for dag_id in (ingest, backfill):
        dag = wait_for(f"the dag-processor to serialize {dag_id}", lambda d=dag_id: next(
            (x for x in api.call("GET", "/api/v2/dags?limit=100")["dags"]
             if x["dag_id"] == d), None), 60, api)
        assert dag["is_paused"] is True
        api.call("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": False})
    assert api.call("GET", f"/api/v2/dags/{ingest}")["timetable_summary"] == "@continuous"

    phase(f"DAGs unpaused ({FORM_NAME} form)")
    producer = Producer(pipeline.name, scheduled.bootstrap, first_id=20)
    if form.producing:
        producer.start()
    try:
        # 1. A scheduled run lands the records so far.
        wait_for("a scheduled ingest run that read records", lambda: succeeded_ingests(
            pipeline), 120, api)
        phase("a run with records")
        if not form.producing:  # the second batch, for a later run to land
            produce_orders(pipeline.name, range(20, 26), bootstrap=scheduled.bootstrap)
            producer.next_id = 26

        # 2. A backfill with parameters, through the REST API: rows lost from the results
        # table (offsets 0..4 of partition 0, ingested by that run) are read again.
        lost = query(f'DELETE FROM "{pipeline.name}" WHERE "partition" = 0 AND "offset" < 5 '
                     'RETURNING "offset"')
        assert len(lost) == 5, lost
        params = {"topic": pipeline.name, "partitions": [0], "from_offset": 0,
                  "to_offset": 5}
        triggered = api.call("POST", f"/api/v2/dags/{backfill}/dagRuns",
                             {"logical_date": None, "conf": params})
        assert triggered["conf"] == params

        # 3. Kafka goes away: the ingest run in flight (and the backfill, if it is still
        # reading) exits 75 and Airflow retries it until Kafka is back.
        for outage in range(1, form.outages + 1):
            before = {ti["dag_run_id"] for ti in retried_tries(api, ingest)}
            producer.pause()
            scheduled.kafka.stack("kafka-down")
            phase(f"Kafka down ({outage}/{form.outages})")
            try:
                failed = wait_for(
                    "an ingest task failed transient and up for retry while Kafka is down",
                    lambda b=before: next((ti for ti in retried_tries(api, ingest)
                                           if ti["dag_run_id"] not in b), None), 120, api)
                phase("an ingest task up for retry")
            finally:
                scheduled.kafka.stack("kafka-up")
            phase("Kafka back")
            producer.resume()
            wait_for("the ingest task retried through the outage to succeed", lambda f=failed: [
                ti for ti in api.tries(ingest) if ti["dag_run_id"] == f["dag_run_id"]
                and ti["state"] == "success"], 120, api)
            phase("the retried task succeeded")
    finally:
        if form.producing:
            producer.stop()  # a later run takes what arrived before

    # 4. Everything lands, the backfill too; then pause and drain.
    run = wait_for("the backfill run to finish", lambda: next(
        (r for r in api.runs(backfill) if r["dag_run_id"] == triggered["dag_run_id"]
         and r["state"] in ("success", "failed")), None), 120, api)
    assert run["state"] == "success", f"backfill run {run}; {api.logs()}"
    phase("backfill succeeded")
    settings = make_settings(pipeline.name, [pipeline.name], bootstrap=scheduled.bootstrap,
                             db_url=TEST_DB_URL)
    produced = producer.next_id

    def caught_up() -> bool:
        rows = query(f'SELECT count(*) FROM "{pipeline.name}"')[0][0]
        return rows == produced

    wait_for(f"all {produced} records in Postgres", caught_up, 90, api)
    phase("caught up")
    successes = sum(ti["state"] == "success" for ti in api.tries(ingest))
    if form.producing:  # the schedule goes on after the recoveries: one run more (a no-op)
        wait_for("one more successful scheduled ingest run", lambda: sum(
            ti["state"] == "success" for ti in api.tries(ingest)) > successes, 90, api)
    # Paused, the DAG starts no task; the scheduler leaves a paused DAG's run states
    # alone, so it is the tasks that must be done, not the runs.
    api.call("PATCH", f"/api/v2/dags/{ingest}", {"is_paused": True})
    wait_for("the last ingest task to end", lambda: not [
        ti for ti in api.tries(ingest) if ti["state"] in ACTIVE], 90, api)

    phase("drained")
    assert_exactly_once(settings, pipeline.name)

    # The scheduler did it: scheduled runs, each outage's run retried through it (a
    # transient failure, then success), the backfill run manual with its conf.
    runs = api.runs(ingest)
    assert {r["run_type"] for r in runs} == {"scheduled"}, runs
    tries = api.tries(ingest)
    assert sum(ti["state"] == "success" for ti in tries) >= 1 + form.outages, tries
    # The records that arrived after the first run landed in a later one.
    assert len(succeeded_ingests(pipeline)) >= 2, succeeded_ingests(pipeline)
    retried = [ti for ti in tries if ti["try_number"] >= 2]
    assert len(retried) >= form.outages, tries
    assert all(ti["state"] == "success" for ti in retried), tries
    for ti in retried:  # each failed attempt: the job's exit 75, a service unreachable
        for attempt in range(1, ti["try_number"]):
            text = api.task_log(ti, attempt)
            assert "pipeline exited 75 (transient" in text and "unreachable" in text, (
                f"attempt {attempt} of {ti['dag_run_id']}:\n{text[-3000:]}")
    assert (run["run_type"], run["conf"]) == ("manual", params)
    assert {ti["task_id"]: ti["state"] for ti in api.tries(backfill)} == {
        "validate_params": "success", "backfill": "success"}
    backfills = query("SELECT status, records_read, rows_written FROM pipeline_runs "
                      "WHERE pipeline = %s AND kind = 'backfill' AND status = 'succeeded'",
                      (pipeline.name,))
    assert backfills == [("succeeded", 5, 5)], backfills
    print(f"scheduler test ({FORM_NAME}): {time.monotonic() - t0:.1f} s after start; "
          f"{len(runs)} ingest runs, {len(retried)} retried, {produced} records")
