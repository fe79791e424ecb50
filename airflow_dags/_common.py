"""Shared wiring of the pipeline's DAGs: where the job lives, how it is submitted, how its
exit code becomes a task state. No pipeline logic lives here; the DAGs only hand
configuration to ``pipeline/submit.py``, the same CLI people run by hand.

One DAG file per kind (ingest.py, backfill.py) builds one DAG per pipeline config found in
PIPELINE_CONFIG_DIR, named after the pipeline: "<name>.ingest", "<name>.backfill".

Parsing reads only the config folder (each file's [pipeline] name and [airflow] table).
Everything a run needs on the worker (the job venv, the connector jars, the packed
environment, pipeline/errors.py, the Airflow Connections) is looked up when the task runs,
so a dag-processor without the job's files still parses the DAGs, a secrets backend is
asked for credentials only by the task that uses them, and a missing piece fails that task
with a message.

The task is our own operator on Airflow's public API (PipelineSubmitOperator): it builds
the spark-submit command from the Spark connection, runs it in its own process group,
streams the job's stderr into the task log, takes the job's JSON summary from stdout as
the XCom, and turns the process's exit code into the task state.

Per pipeline, the config's [airflow] table (docs/airflow.md) sets schedule, retries,
owner, tags, pool, queue and the connections; the environment gives the defaults:
  PIPELINE_CONFIG_DIR    the folder of pipeline configs (*.toml), one pair of DAGs each
                         (default: $PIPELINE_HOME/conf)
  PIPELINE_HOME          the repository with pipeline/ and sql/ (default: this file's repo)
  PIPELINE_VENV          the job's virtualenv with pyspark (default: $PIPELINE_HOME/.venv)
  PIPELINE_JARS_DIR      Spark's Kafka connector jars (default: $PIPELINE_HOME/.jars/spark)
  PIPELINE_SCHEDULE      the ingest DAGs' schedule (default: */5 * * * *)
  PIPELINE_SPARK_CONN_ID Airflow connection of conn_type spark (default: spark_local)
  PIPELINE_ARCHIVE       the job's packed environment for a cluster's executors (default:
                         $PIPELINE_HOME/dist/pipeline-env.tar.gz, built by scripts/package)
  PIPELINE_SHIP_ENV      auto (default: ship PIPELINE_ARCHIVE when the connection's master
                         is spark://...), always (e.g. YARN client mode), never (the
                         workers have the job's environment installed)
  PIPELINE_RETRIES, PIPELINE_RETRY_DELAY_SECONDS, PIPELINE_MAX_RETRY_DELAY_SECONDS
                         retries of transient failures (default 3, 60 s doubling, 900 s cap)
  PIPELINE_TASK_TIMEOUT_SECONDS
                         a run is stopped (and retried) after this long (default 7200)
  PIPELINE_OWNER         the tasks' owner (default: data-engineering)
"""

from __future__ import annotations

import collections
import functools
import importlib.util
import json
import logging
import os
import re
import shlex
import signal
import subprocess
import threading
import tomllib
from contextlib import suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote, urlencode

from _lineage import lineage_datasets
from airflow.sdk import BaseHook, BaseOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

PIPELINE_HOME = Path(os.environ.get("PIPELINE_HOME") or Path(__file__).resolve().parent.parent)
PIPELINE_VENV = Path(os.environ.get("PIPELINE_VENV") or PIPELINE_HOME / ".venv")
JARS_DIR = Path(os.environ.get("PIPELINE_JARS_DIR") or PIPELINE_HOME / ".jars" / "spark")
CONFIG_DIR = Path(os.environ.get("PIPELINE_CONFIG_DIR") or PIPELINE_HOME / "conf")
SCHEDULE = os.environ.get("PIPELINE_SCHEDULE") or "*/5 * * * *"
SPARK_CONN_ID = os.environ.get("PIPELINE_SPARK_CONN_ID", "spark_local")
APPLICATION = PIPELINE_HOME / "pipeline" / "submit.py"
SPARK_SUBMIT = PIPELINE_VENV / "bin" / "spark-submit"
ARCHIVE = Path(os.environ.get("PIPELINE_ARCHIVE")
               or PIPELINE_HOME / "dist" / "pipeline-env.tar.gz")
SHIP_ENV = os.environ.get("PIPELINE_SHIP_ENV", "auto")
if SHIP_ENV not in ("auto", "always", "never"):
    raise ValueError(f"PIPELINE_SHIP_ENV={SHIP_ENV!r}: use auto, always or never")
# Where Spark unpacks the archive in each executor's working directory (<archive>#job).
ARCHIVE_ALIAS = "job"
# What the job reads instead of its config's database.url / kafka.bootstrap_servers
# (pipeline/settings/env.py); a connection's client settings arrive as KAFKA_<KEY> for the
# config's ${KAFKA_...} references.
ENV_DATABASE_URL = "PIPELINE__DATABASE__URL"
ENV_BOOTSTRAP = "PIPELINE__KAFKA__BOOTSTRAP_SERVERS"


log = logging.getLogger(__name__)
_DAG_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


# ---- the pipelines and their [airflow] tables (read when the DAGs are parsed) --------------

# The [airflow] keys and their TOML types; pipeline/settings/airflow.py checks the same table (the
# job ignores it), so a typo fails the job with its one-line config error.
AIRFLOW_KEYS: dict[str, type | tuple[type, ...]] = {
    "schedule": str, "retries": int, "retry_delay_seconds": (int, float),
    "max_retry_delay_seconds": (int, float), "execution_timeout_seconds": (int, float),
    "owner": str, "tags": list, "pool": str, "pool_slots": int, "queue": str,
    "spark_conn_id": str, "postgres_conn_id": str, "kafka_conn_id": str,
}


@dataclass(frozen=True)
class PipelineConfig:
    name: str  # the config's [pipeline] name, or the file's stem if it cannot be read
    path: Path
    airflow: dict[str, Any] = field(default_factory=dict)  # its valid [airflow] table


def airflow_table(doc: dict[str, Any], path: Path) -> dict[str, Any]:
    """The config's [airflow] table, or {} (the defaults) if it has a mistake: the job
    then fails with its config error (exit 2), naming the key - the DAGs stay visible."""
    table = doc.get("airflow", {})
    problem = None
    if not isinstance(table, dict):
        problem = "'airflow' must be a table ([airflow])"
    else:
        for key, value in table.items():
            typ = AIRFLOW_KEYS.get(key)
            if typ is None:
                problem = f"unknown key 'airflow.{key}'"
            elif isinstance(value, bool) or not isinstance(value, typ):
                problem = f"'airflow.{key}' has the wrong type ({type(value).__name__})"
            elif key == "tags" and not all(isinstance(t, str) for t in value):
                problem = "'airflow.tags' must be a list of strings"
            elif isinstance(value, int | float) and value < (
                    0 if key in ("retries", "retry_delay_seconds") else 1):
                problem = f"'airflow.{key}' = {value} is out of range"
            elif isinstance(value, str) and not value.strip():
                problem = f"'airflow.{key}' is empty"
    if problem:
        log.warning("pipeline config %s: %s; its DAGs use the defaults and its runs fail "
                    "with the job's config error", path, problem)
        return {}
    return table


def pipeline_configs(folder: Path | None = None) -> list[PipelineConfig]:
    """The pipelines to build DAGs for: every *.toml in ``folder``, named by its
    [pipeline] name. A file that cannot be read still gets its DAGs, named after the file:
    its task runs the job, which fails at once (exit 2) with the config's own error - more
    visible than a DAG that silently disappears. Two files naming the same pipeline would
    share its offsets and lock, so that is a parse error naming both."""
    folder = folder or CONFIG_DIR
    found: dict[str, PipelineConfig] = {}
    for path in sorted(folder.glob("*.toml")):
        table: dict[str, Any] = {}
        try:
            doc = tomllib.loads(path.read_text())
            name = str(doc["pipeline"]["name"])
            table = airflow_table(doc, path)
        except (OSError, ValueError, KeyError, TypeError) as e:
            name = path.stem
            log.warning("pipeline config %s is not readable (%s): its DAGs will fail with "
                        "the job's error", path, e)
        name = _DAG_ID_UNSAFE.sub("_", name)
        if name in found:
            raise ValueError(f"pipeline configs {found[name].path} and {path} both name the "
                             f"pipeline {name!r}: give each pipeline its own name")
        found[name] = PipelineConfig(name, path, table)
    return list(found.values())


def _seconds(table: dict[str, Any], key: str, env: str, default: str) -> timedelta:
    return timedelta(seconds=float(table.get(key, os.environ.get(env) or default)))


def default_args(table: dict[str, Any] | None = None) -> dict[str, Any]:
    """Retries with exponential backoff, owner, pool, queue: the pipeline's [airflow]
    table first, then the environment. Retries only ever happen for the job's retryable
    exit codes (PipelineSubmitOperator fails every other one at once)."""
    table = table or {}
    args = {
        "owner": table.get("owner") or os.environ.get("PIPELINE_OWNER") or "data-engineering",
        "retries": int(table.get("retries", os.environ.get("PIPELINE_RETRIES") or 3)),
        "retry_delay": _seconds(table, "retry_delay_seconds",
                                "PIPELINE_RETRY_DELAY_SECONDS", "60"),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": _seconds(table, "max_retry_delay_seconds",
                                    "PIPELINE_MAX_RETRY_DELAY_SECONDS", "900"),
        "execution_timeout": _seconds(table, "execution_timeout_seconds",
                                      "PIPELINE_TASK_TIMEOUT_SECONDS", "7200"),
    }
    for key in ("pool", "pool_slots", "queue"):
        if key in table:
            args[key] = table[key]
    return args


def dag_settings(pipeline: str, table: dict[str, Any] | None = None) -> dict[str, Any]:
    """What every DAG of a pipeline shares: no catch-up, one run at a time (the job holds
    the pipeline's lock anyway), retries with backoff, tagged with the pipeline's name and
    the [airflow] table's tags."""
    tags = ["pipeline", "kafka", "spark", pipeline]
    tags += [t for t in (table or {}).get("tags", []) if t not in tags]
    return {"start_date": datetime(2025, 1, 1, tzinfo=UTC), "catchup": False,
            "max_active_runs": 1, "default_args": default_args(table), "tags": tags}


def schedule_of(table: dict[str, Any]) -> str | None:
    """The ingest DAG's schedule: [airflow] schedule ("none" = only when triggered), else
    PIPELINE_SCHEDULE."""
    schedule = table.get("schedule") or SCHEDULE
    return None if schedule.lower() == "none" else schedule


def connection_ids(table: dict[str, Any]) -> dict[str, str | None]:
    """The operator's connection ids for a pipeline (names only: resolved when it runs)."""
    return {"spark_conn_id": table.get("spark_conn_id") or SPARK_CONN_ID,
            "postgres_conn_id": table.get("postgres_conn_id"),
            "kafka_conn_id": table.get("kafka_conn_id")}


# ---- what the worker has (looked up when the task runs) ------------------------------------

@functools.cache
def _exit_codes():
    """The job's own table of exit codes (pipeline/errors.py has no dependencies), loaded
    by path when a task finishes, so that the Airflow venv needs neither the job's packages
    nor sys.path edits, and parsing needs no job files."""
    path = PIPELINE_HOME / "pipeline" / "errors.py"
    if not path.is_file():
        raise AirflowFailException(f"{path} not found: set PIPELINE_HOME to the pipeline's "
                                   "repository on this worker")
    spec = importlib.util.spec_from_file_location("_pipeline_exit_codes", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.EXIT_CODES, module.RETRYABLE_EXIT_CODES


def connector_jars() -> str:
    """The Kafka connector jars, passed when this worker has them. No run needs them (every
    path, a [sink] transform's included, reads Kafka with the job's own reader); a user's
    transform that reads other Kafka data through Spark's source would."""
    jars = sorted(str(p) for p in JARS_DIR.glob("*.jar"))
    return ",".join(jars) if any("spark-sql-kafka" in j for j in jars) else ""


def job_env() -> dict[str, str]:
    """spark-submit's environment on top of the worker's: the driver and the Python workers
    run the job venv's interpreter (psycopg, confluent-kafka live there, not in Airflow's)."""
    python = str(PIPELINE_VENV / "bin" / "python")
    return {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python,
            "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1"),
            "PIPELINE_JARS_DIR": str(JARS_DIR)}


def ships_environment(master: str) -> bool:
    """Whether a submission to ``master`` ships the packed environment: the executors of a
    standalone cluster (spark://) run on hosts that have neither the job venv nor the
    repository (docs/cluster.md); local[*] runs on this worker, where the venv is."""
    if SHIP_ENV != "auto":
        return SHIP_ENV == "always"
    return master.startswith("spark://")


def shipped_conf() -> dict[str, str]:
    """What makes the executors' Python workers run the shipped environment. The driver
    runs here, in client mode, with the job venv's python: without
    spark.pyspark.driver.python spark-submit would start it with ./job/bin/python, which
    only exists on the executors."""
    return {"spark.pyspark.python": f"./{ARCHIVE_ALIAS}/bin/python",
            "spark.pyspark.driver.python": str(PIPELINE_VENV / "bin" / "python")}


# ---- connections -> spark-submit options and the job's environment ------------------------

@dataclass(frozen=True)
class SparkTarget:
    """What a connection of conn_type spark says (as the Spark provider reads it): the
    master (host, with the port if one is set), and from its extra deploy-mode, queue,
    namespace (Kubernetes), principal and keytab (Kerberos)."""
    master: str
    deploy_mode: str | None = None
    queue: str | None = None
    namespace: str | None = None
    principal: str | None = None
    keytab: str | None = None


def spark_target(conn: Any) -> SparkTarget:
    host = (conn.host or "yarn").strip()
    master = f"{host}:{conn.port}" if conn.port else host
    extra = conn.extra_dejson
    return SparkTarget(master, extra.get("deploy-mode") or extra.get("deploy_mode"),
                       extra.get("queue"), extra.get("namespace"), extra.get("principal"),
                       extra.get("keytab"))


def spark_submit_command(target: SparkTarget, *, name: str, conf: dict[str, str],
                         jars: str, archives: str, application: str,
                         application_args: list[str]) -> list[str]:
    """The spark-submit command line (no secret ever goes here: it is logged, and any
    user of the host can read a process's arguments)."""
    cmd = [str(SPARK_SUBMIT), "--master", target.master]
    if target.deploy_mode:
        cmd += ["--deploy-mode", target.deploy_mode]
    if target.queue:
        cmd += ["--queue", target.queue]
    if target.namespace:
        conf = {"spark.kubernetes.namespace": target.namespace, **conf}
    if target.principal:
        cmd += ["--principal", target.principal]
    if target.keytab:
        cmd += ["--keytab", target.keytab]
    for key, value in conf.items():
        cmd += ["--conf", f"{key}={value}"]
    if jars:
        cmd += ["--jars", jars]
    if archives:
        cmd += ["--archives", archives]
    return [*cmd, "--name", name, application, *application_args]


def postgres_url(conn: Any) -> str:
    """A postgres connection as the job's database URL: host, port, login, password,
    schema (Airflow's name for the database) and the extra's libpq parameters (sslmode,
    sslrootcert, ...) as the query string."""
    if not conn.host:
        raise AirflowFailException(f"connection {conn.conn_id!r} has no host: set the "
                                   "Postgres server's host name in it - not retried")
    auth = ""
    if conn.login:
        auth = quote(conn.login, safe="")
        if conn.password:
            auth += ":" + quote(conn.password, safe="")
        auth += "@"
    port = f":{conn.port}" if conn.port else ""
    params = {k: str(v) for k, v in conn.extra_dejson.items() if v is not None}
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{auth}{conn.host}{port}/{conn.schema or 'postgres'}{query}"


def kafka_env_name(key: str) -> str:
    """The variable a Kafka client setting is handed over in: sasl.password ->
    KAFKA_SASL_PASSWORD, for the config's ${KAFKA_SASL_PASSWORD}."""
    return "KAFKA_" + re.sub(r"[^A-Za-z0-9]", "_", key).upper()


def kafka_env(conn: Any) -> dict[str, str]:
    """A Kafka connection (the Kafka provider's shape: the client settings as the extra,
    bootstrap.servers among them) as the job's environment."""
    settings = dict(conn.extra_dejson)
    servers = settings.pop("bootstrap.servers", None) or (
        f"{conn.host}:{conn.port}" if conn.host and conn.port else conn.host)
    if not servers:
        raise AirflowFailException(f"connection {conn.conn_id!r} has no bootstrap.servers "
                                   "in its extra: add it - not retried")
    env = {ENV_BOOTSTRAP: str(servers)}
    for key, value in settings.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        env[kafka_env_name(key)] = text
    return env


SECRET_SETTING = re.compile(r"(password|secret|token|jaas|credentials|key)", re.I)


def unused_kafka_settings(config_text: str, env: dict[str, str]) -> list[str]:
    """The connection's client settings this config neither references (${KAFKA_...}) nor
    sets itself: the job would connect without them."""
    return [name for name in env if name != ENV_BOOTSTRAP
            and "${" + name + "}" not in config_text]


# ---- the operator ---------------------------------------------------------------------------

@dataclass(frozen=True)
class JobOutcome:
    """What one execute() learnt, for the OpenLineage facets: the datasets (known before
    the job starts), the job's exit code (None: it never ran) and its JSON summary (on
    success). Read from the process and its stdout document, never from log text."""
    datasets: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    summary: dict[str, Any] | None = None


class PipelineTransientError(AirflowException):
    """The job exited with a retryable code (75 transient, 143 terminated): Airflow retries."""


# Airflow escalates to SIGKILL 5 s after SIGTERM; the driver unwinds on its own anyway.
KILL_GRACE_SECONDS = 4.0


def readable(cmd: list[str]) -> str:
    """The command as a person would type it: quoted only where a shell needs it for a
    space or a quote (local[2] stays local[2])."""
    return " ".join(shlex.quote(a) if re.search(r"[\s'\"]", a) or not a else a for a in cmd)


def exit_code_of(returncode: int) -> int:
    """A process's exit code as a shell reports it: killed by signal N = 128 + N."""
    return 128 - returncode if returncode < 0 else returncode


def last_error_line(lines: list[str]) -> str:
    """The job's one-line error (cli.py prints 'error: ...' to stderr before exiting)."""
    for line in reversed(lines):
        if line.startswith("error: "):
            return line
    return next((line for line in reversed(lines) if line.strip()), "(no output)")


def summary_of(stdout: str) -> dict | None:
    """The job's --json summary: submit.py keeps stdout to that one document."""
    text = stdout.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        for line in reversed(text.splitlines()):  # something else printed before it
            if line.startswith("{"):
                with suppress(ValueError):
                    return json.loads(line)
    return None


class PipelineSubmitOperator(BaseOperator):
    """spark-submit of ``pipeline/submit.py <args>`` whose exit code decides the task state:
    0 succeeds (the job's JSON summary is the task's XCom), 75 and 143 raise a retryable
    error, any other code fails the task at once (AirflowFailException, no retry) with the
    job's one-line error.

    Connections, resolved when the task runs: ``spark_conn_id`` (master, deploy-mode,
    queue), and optionally ``postgres_conn_id`` and ``kafka_conn_id``, whose credentials
    reach the job through its environment only (never the command line or the log)."""

    template_fields = ("application_args", "name", "conf")
    ui_color = "#fde9c8"

    def __init__(self, *, application_args: Any, config: str | Path | None = None,
                 spark_conn_id: str = SPARK_CONN_ID, postgres_conn_id: str | None = None,
                 kafka_conn_id: str | None = None, name: str = "{{ dag.dag_id }}",
                 conf: dict[str, str] | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.application = str(APPLICATION)
        self.application_args = application_args
        self.config = str(config) if config else None
        self.spark_conn_id = spark_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.name = name
        self.conf = conf if conf is not None else {"spark.log.level": "WARN"}
        self.spark_submit = str(SPARK_SUBMIT)
        self._process: subprocess.Popen | None = None
        self._outcome = JobOutcome()

    # -- what to run --------------------------------------------------------------------------

    def submit_command(self) -> list[str]:
        """The command line, with the Spark connection resolved now, on the worker; the
        packed environment is shipped when the master runs executors elsewhere."""
        target = spark_target(BaseHook.get_connection(self.spark_conn_id))
        conf, archives = dict(self.conf), ""
        if ships_environment(target.master):
            if not ARCHIVE.is_file():
                raise AirflowFailException(
                    f"the Spark master {target.master} runs executors on other hosts, which "
                    f"need the job's packed environment, and {ARCHIVE} does not exist: build "
                    f"it with 'scripts/package' in {PIPELINE_HOME} (or set PIPELINE_ARCHIVE), "
                    "then clear the task - not retried")
            archives = f"{ARCHIVE}#{ARCHIVE_ALIAS}"
            conf = {**shipped_conf(), **conf}  # a task's own conf wins
            self.log.info("master %s: shipping the job's environment %s", target.master,
                          archives)
        return spark_submit_command(
            target, name=self.name, conf=conf, jars=connector_jars(), archives=archives,
            application=self.application, application_args=list(self.application_args))

    def credentials_env(self) -> dict[str, str]:
        """The Postgres and Kafka connections as the job's environment, each secret
        registered with Airflow's masker so that no log line can show it."""
        from airflow.sdk.log import mask_secret

        env: dict[str, str] = {}
        if self.postgres_conn_id:
            conn = BaseHook.get_connection(self.postgres_conn_id)
            if conn.password:
                mask_secret(conn.password)
                mask_secret(quote(conn.password, safe=""))
            env[ENV_DATABASE_URL] = postgres_url(conn)
            self.log.info("database from connection %r (%s@%s:%s/%s)", self.postgres_conn_id,
                          conn.login, conn.host, conn.port or 5432, conn.schema)
        if self.kafka_conn_id:
            conn = BaseHook.get_connection(self.kafka_conn_id)
            kafka = kafka_env(conn)
            for key, value in conn.extra_dejson.items():
                if SECRET_SETTING.search(key) and value:
                    mask_secret(str(value))
            env.update(kafka)
            self.log.info("Kafka from connection %r: bootstrap servers %s; settings in %s",
                          self.kafka_conn_id, kafka[ENV_BOOTSTRAP],
                          ", ".join(sorted(set(kafka) - {ENV_BOOTSTRAP})) or "none")
            unused = self._unused_kafka_settings(kafka)
            if unused:
                self.log.warning(
                    "connection %r carries %s, which %s does not use: refer to each in the "
                    "config's [kafka.consumer]/[kafka.admin_client] table as \"${NAME}\", "
                    "e.g. \"sasl.password\" = \"${KAFKA_SASL_PASSWORD}\"", self.kafka_conn_id,
                    ", ".join(unused), self.config)
        return env

    def _unused_kafka_settings(self, env: dict[str, str]) -> list[str]:
        if not self.config:
            return []
        try:
            text = Path(self.config).read_text()
        except OSError:
            return []  # the job says what is wrong with the file
        return unused_kafka_settings(text, env)

    # -- running it ---------------------------------------------------------------------------

    def execute(self, context: Any) -> dict | None:
        cmd = self.submit_command()
        env = {**os.environ, **job_env(), **self.credentials_env()}
        self.log.info("spark-submit command: %s", readable(cmd))
        self._outcome = JobOutcome(self._datasets(env))
        try:
            # Its own session and process group: on_kill can stop spark-submit, the
            # driver and anything they started, and nothing of ours.
            self._process = subprocess.Popen(
                cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise AirflowFailException(
                f"cannot start {cmd[0]} ({e.strerror}): set PIPELINE_VENV to the job's "
                "virtualenv on this worker (scripts/stack install) - not retried") from None
        process = self._process
        stdout: list[bytes] = []
        stderr: collections.deque[str] = collections.deque(maxlen=500)
        readers = [threading.Thread(target=lambda: stdout.append(process.stdout.read()),
                                    name="job-stdout", daemon=True),
                   threading.Thread(target=self._stream_stderr, args=(process, stderr),
                                    name="job-stderr", daemon=True)]
        for reader in readers:
            reader.start()
        try:
            returncode = process.wait()
        except BaseException:
            self._stop(process)  # a timeout or a signal interrupted the wait
            raise
        for reader in readers:
            reader.join(timeout=60)  # EOF once the job's processes are gone
        code = exit_code_of(returncode)
        summary = summary_of(b"".join(stdout).decode(errors="replace")) if code == 0 else None
        self._outcome = JobOutcome(self._outcome.datasets, code, summary)
        if code != 0:
            self._fail(code, list(stderr))
        return summary

    def _datasets(self, env: dict[str, str]) -> dict[str, Any]:
        """What the run reads and writes, as OpenLineage names them, from the config and
        the environment the job runs with; nothing if the config cannot tell."""
        try:
            doc = tomllib.loads(Path(self.config).read_text()) if self.config else {}
            return lineage_datasets(doc, list(self.application_args), env,
                                    servers=env.get(ENV_BOOTSTRAP), url=env.get(ENV_DATABASE_URL))
        except (OSError, ValueError, KeyError, TypeError) as e:
            self.log.warning("no lineage for this run: %s", e)
            return {}

    # -- OpenLineage (apache-airflow-providers-openlineage calls these; optional) ------------

    def get_openlineage_facets_on_complete(self, task_instance: Any) -> Any:
        """The topics read, the table written, and the job's published offsets as a run
        facet (airflow_dags/_lineage.py)."""
        from _lineage import operator_lineage

        outcome = self._outcome
        meaning = _exit_codes()[0].get(outcome.exit_code, "unknown exit code") if (
            outcome.exit_code is not None) else ""
        return operator_lineage(outcome.datasets, outcome.summary, outcome.exit_code, meaning)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """The same datasets; the facet tells the job's exit code and that nothing was
        published (a failed job rolls back)."""
        return self.get_openlineage_facets_on_complete(task_instance)

    def _stream_stderr(self, process: subprocess.Popen, tail: collections.deque) -> None:
        """The job's log into the task log, line by line, as it comes."""
        for raw in process.stderr:
            line = raw.decode(errors="replace").rstrip("\n")
            tail.append(line)
            self.log.info("%s", line)

    def _fail(self, code: int, lines: list[str]) -> None:
        error = last_error_line(lines)
        exit_codes, retryable = _exit_codes()
        meaning = exit_codes.get(code, "unknown exit code")
        if code in retryable:
            self.log.warning("pipeline exited %d (%s): %s", code, meaning, error)
            raise PipelineTransientError(f"pipeline exited {code} ({meaning}): {error}")
        self.log.error("pipeline exited %d (%s): %s", code, meaning, error)
        raise AirflowFailException(f"pipeline exited {code} ({meaning}): {error} - not retried")

    def on_kill(self) -> None:
        """Airflow stops the task (timeout, marked failed, worker shutdown). First SIGTERM
        the job's Python driver: it cancels its Spark jobs, rolls back, records the run as
        failed and exits 143 (spark-submit would not pass a signal on). Then, after a
        grace period, stop whatever is left of the process group."""
        if self._process is not None:
            self._stop(self._process)

    def _stop(self, process: subprocess.Popen) -> None:
        if process.poll() is not None:
            return
        import psutil

        children = []
        with suppress(psutil.Error):
            children = psutil.Process(process.pid).children(recursive=True)
        for child in children:
            with suppress(psutil.Error):  # e.g. the launcher's zombie shell
                if self.application in child.cmdline():
                    self.log.info("sending SIGTERM to the pipeline driver (pid %d)", child.pid)
                    child.terminate()
        with suppress(subprocess.TimeoutExpired):
            process.wait(timeout=KILL_GRACE_SECONDS)
        # spark-submit returns once its driver has: if it still runs, the driver did not
        # unwind in time; stop the whole group, politely first.
        for sig in (signal.SIGTERM, signal.SIGKILL):
            if process.poll() is not None:
                break
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, sig)  # the group's id is spark-submit's pid
                self.log.info("sent %s to the spark-submit process group %d", sig.name,
                              process.pid)
            with suppress(subprocess.TimeoutExpired):
                process.wait(timeout=KILL_GRACE_SECONDS)
