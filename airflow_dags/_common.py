"""Shared wiring of the pipeline's DAGs: where the job lives, how it is submitted, how its
exit code becomes a task state. No pipeline logic lives here; the DAGs only hand
configuration to ``pipeline/submit.py``, the same CLI people run by hand.

One DAG file per kind (ingest.py, backfill.py) builds one DAG per pipeline config found in
PIPELINE_CONFIG_DIR, named after the pipeline: "<name>.ingest", "<name>.backfill".

Parsing reads only the config folder (each file's [pipeline] name). Everything a run needs
on the worker (the job venv, the connector jars, the packed environment,
pipeline/errors.py) is looked up when the task runs, so a dag-processor without the job's
files still parses the DAGs, and a missing piece fails that task with a message.

Environment (read when the DAG files are parsed; see docs/airflow.md):
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
"""

from __future__ import annotations

import functools
import importlib.util
import json
import logging
import os
import re
import subprocess
import tomllib
from contextlib import suppress
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from airflow.providers.apache.spark.operators.spark_submit import SparkSubmitOperator
from airflow.sdk.exceptions import AirflowException, AirflowFailException

PIPELINE_HOME = Path(os.environ.get("PIPELINE_HOME") or Path(__file__).resolve().parent.parent)
PIPELINE_VENV = Path(os.environ.get("PIPELINE_VENV") or PIPELINE_HOME / ".venv")
JARS_DIR = Path(os.environ.get("PIPELINE_JARS_DIR") or PIPELINE_HOME / ".jars" / "spark")
CONFIG_DIR = Path(os.environ.get("PIPELINE_CONFIG_DIR") or PIPELINE_HOME / "conf")
SCHEDULE = os.environ.get("PIPELINE_SCHEDULE") or "*/5 * * * *"
SPARK_CONN_ID = os.environ.get("PIPELINE_SPARK_CONN_ID", "spark_local")
APPLICATION = PIPELINE_HOME / "pipeline" / "submit.py"
ARCHIVE = Path(os.environ.get("PIPELINE_ARCHIVE")
               or PIPELINE_HOME / "dist" / "pipeline-env.tar.gz")
SHIP_ENV = os.environ.get("PIPELINE_SHIP_ENV", "auto")
if SHIP_ENV not in ("auto", "always", "never"):
    raise ValueError(f"PIPELINE_SHIP_ENV={SHIP_ENV!r}: use auto, always or never")
# Where Spark unpacks the archive in each executor's working directory (<archive>#job).
ARCHIVE_ALIAS = "job"


log = logging.getLogger(__name__)
_DAG_ID_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class PipelineConfig:
    name: str  # the config's [pipeline] name, or the file's stem if it cannot be read
    path: Path


def pipeline_configs(folder: Path | None = None) -> list[PipelineConfig]:
    """The pipelines to build DAGs for: every *.toml in ``folder``, named by its
    [pipeline] name. A file that cannot be read still gets its DAGs, named after the file:
    its task runs the job, which fails at once (exit 2) with the config's own error - more
    visible than a DAG that silently disappears. Two files naming the same pipeline would
    share its offsets and lock, so that is a parse error naming both."""
    folder = folder or CONFIG_DIR
    found: dict[str, PipelineConfig] = {}
    for path in sorted(folder.glob("*.toml")):
        try:
            name = str(tomllib.loads(path.read_text())["pipeline"]["name"])
        except (OSError, ValueError, KeyError, TypeError) as e:
            name = path.stem
            log.warning("pipeline config %s is not readable (%s): its DAGs will fail with "
                        "the job's error", path, e)
        name = _DAG_ID_UNSAFE.sub("_", name)
        if name in found:
            raise ValueError(f"pipeline configs {found[name].path} and {path} both name the "
                             f"pipeline {name!r}: give each pipeline its own name")
        found[name] = PipelineConfig(name, path)
    return list(found.values())


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
    """The Kafka connector jars, when this worker has them. Only a [sink] transform reads
    through Spark's Kafka source; without them the job itself says, exit 2, how to provide
    them (so the built-in sinks need no jars on the worker)."""
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


def default_args() -> dict[str, Any]:
    """Retries with exponential backoff. They only ever happen for the job's retryable exit
    codes (PipelineSubmitOperator fails every other one at once)."""
    return {
        "owner": "data-engineering",
        "retries": int(os.environ.get("PIPELINE_RETRIES", "3")),
        "retry_delay": timedelta(seconds=float(os.environ.get("PIPELINE_RETRY_DELAY_SECONDS",
                                                              "60"))),
        "retry_exponential_backoff": 2.0,
        "max_retry_delay": timedelta(
            seconds=float(os.environ.get("PIPELINE_MAX_RETRY_DELAY_SECONDS", "900"))),
        "execution_timeout": timedelta(
            seconds=float(os.environ.get("PIPELINE_TASK_TIMEOUT_SECONDS", "7200"))),
    }


def dag_settings(pipeline: str) -> dict[str, Any]:
    """What every DAG of a pipeline shares: no catch-up, one run at a time, retries with
    backoff, tagged with the pipeline's name."""
    return {"start_date": datetime(2025, 1, 1, tzinfo=UTC), "catchup": False,
            "max_active_runs": 1, "default_args": default_args(),
            "tags": ["pipeline", "kafka", "spark", pipeline]}


class PipelineTransientError(AirflowException):
    """The job exited with a retryable code (75 transient, 143 terminated): Airflow retries."""


# Airflow escalates to SIGKILL 5 s after SIGTERM; the driver unwinds on its own anyway.
KILL_GRACE_SECONDS = 4.0
_EXIT_CODE = re.compile(r"Error code is: (-?\d+)")


def exit_code_of(error: BaseException) -> int | None:
    """spark-submit's exit code from SparkSubmitHook's message, as a shell reports it
    (killed by signal N = 128 + N), or None if the failure did not come from its exit."""
    m = _EXIT_CODE.search(str(error))
    if m is None:
        return None
    code = int(m.group(1))
    return 128 - code if code < 0 else code


def last_error_line(lines: list[str]) -> str:
    """The job's one-line error (cli.py prints 'error: ...' to stderr before exiting)."""
    for line in reversed(lines):
        if line.startswith("error: "):
            return line
    return next((line for line in reversed(lines) if line.strip()), "(no output)")


class PipelineSubmitOperator(SparkSubmitOperator):
    """spark-submit of ``pipeline/submit.py <args>`` whose exit code decides the task state:
    0 succeeds (the job's JSON summary is the task's XCom), 75 and 143 raise a retryable
    error, any other code fails the task at once (AirflowFailException, no retry) with the
    job's one-line error."""

    def __init__(self, *, application_args: Any, **kwargs: Any) -> None:
        kwargs.setdefault("conn_id", SPARK_CONN_ID)
        kwargs.setdefault("name", "{{ dag.dag_id }}")
        kwargs.setdefault("conf", {"spark.log.level": "WARN"})  # keep the task log readable
        super().__init__(
            application=str(APPLICATION), application_args=application_args,
            spark_binary=str(PIPELINE_VENV / "bin" / "spark-submit"),
            env_vars=job_env(), **kwargs)

    def _get_hook(self):
        """The provider's hook, plus the packed environment when the connection's master
        runs executors elsewhere (ships_environment). The master is only known here: the
        hook resolves the connection when the task runs, not when the DAG is parsed. The
        jars too are looked up here, on the worker."""
        self.jars = connector_jars() or None
        hook = super()._get_hook()
        master = hook._connection["master"]
        if ships_environment(master):
            if not ARCHIVE.is_file():
                raise AirflowFailException(
                    f"the Spark master {master} runs executors on other hosts, which need "
                    f"the job's packed environment, and {ARCHIVE} does not exist: build it "
                    f"with 'scripts/package' in {PIPELINE_HOME} (or set PIPELINE_ARCHIVE), "
                    "then clear the task - not retried")
            shipped = f"{ARCHIVE}#{ARCHIVE_ALIAS}"
            hook._archives = ",".join(a for a in (hook._archives, shipped) if a)
            hook._conf = {**shipped_conf(), **hook._conf}  # a task's own conf wins
            self.log.info("master %s: shipping the job's environment %s", master, shipped)
        return hook

    def _output(self, error: BaseException | None = None) -> list[str]:
        lines = list(getattr(self._hook, "_last_submit_log_lines", None) or [])
        return lines or (str(error).splitlines() if error else [])

    def execute(self, context: Any) -> dict | None:
        try:
            super().execute(context)
        except Exception as e:
            code = exit_code_of(e)
            if code is None:
                raise  # not the job's exit (e.g. spark-submit missing): Airflow's defaults
            error = last_error_line(self._output(e))
            exit_codes, retryable = _exit_codes()
            meaning = exit_codes.get(code, "unknown exit code")
            if code in retryable:
                self.log.warning("pipeline exited %d (%s): %s", code, meaning, error)
                raise PipelineTransientError(
                    f"pipeline exited {code} ({meaning}): {error}") from None
            self.log.error("pipeline exited %d (%s): %s", code, meaning, error)
            raise AirflowFailException(
                f"pipeline exited {code} ({meaning}): {error} - not retried") from None
        return self._summary()

    def on_kill(self) -> None:
        """Airflow stops the task (timeout, marked failed, worker shutdown). The provider
        only kills spark-submit's JVM, which leaves the job's Python driver (its child)
        running as an orphan. So first SIGTERM the driver: it cancels its Spark jobs, rolls
        back, records the run as failed and exits 143; then let the provider kill the rest."""
        submit = getattr(self._hook, "_submit_sp", None)
        if submit is not None and submit.poll() is None:
            import psutil

            children = []
            with suppress(psutil.Error):
                children = psutil.Process(submit.pid).children()
            for child in children:
                with suppress(psutil.Error):  # e.g. the launcher's zombie shell
                    if str(APPLICATION) in child.cmdline():
                        self.log.info("sending SIGTERM to the pipeline driver (pid %d)", child.pid)
                        child.terminate()
            with suppress(subprocess.TimeoutExpired):
                submit.wait(timeout=KILL_GRACE_SECONDS)
        super().on_kill()

    def _summary(self) -> dict | None:
        """The job's --json summary line, if it printed one."""
        for line in reversed(self._output()):
            if line.startswith("{"):
                try:
                    return json.loads(line)
                except ValueError:
                    return None
        return None
