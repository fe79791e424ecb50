"""PipelineSubmitOperator: the submitting task of both DAGs, on Airflow's public API only.
When it runs it resolves the Spark connection, builds the spark-submit command of
``pipeline/submit.py <args> --summary-file <file>``, hands the Postgres and Kafka
connections to the job through its environment, runs it (job_process.py) and turns its
exit code into the task's state and its summary file into the XCom (outcome.py)."""

from __future__ import annotations

import os
import tempfile
import tomllib
from pathlib import Path
from typing import Any

from airflow.sdk import BaseHook, BaseOperator
from airflow.sdk.exceptions import AirflowFailException

from pipeline_airflow import deployment, job_package
from pipeline_airflow.connections import ENV_BOOTSTRAP, ENV_DATABASE_URL, credentials_env
from pipeline_airflow.job_process import JobProcess
from pipeline_airflow.lineage import lineage_datasets
from pipeline_airflow.outcome import JobOutcome, fail_for_exit, read_summary
from pipeline_airflow.spark_submit import (
    readable,
    shipped_archive,
    shipped_conf,
    ships_environment,
    spark_submit_command,
    spark_target,
)


class PipelineSubmitOperator(BaseOperator):
    """spark-submit of ``pipeline/submit.py <application_args>`` whose exit code decides
    the task state: 0 succeeds (the job's summary is the task's XCom), 75 and 143 raise a
    retryable error, any other code fails the task at once (AirflowFailException, no
    retry) with the job's one-line error.

    Connections, resolved when the task runs: ``spark_conn_id`` (master, deploy-mode,
    queue), and optionally ``postgres_conn_id`` and ``kafka_conn_id``, whose credentials
    reach the job through its environment only (never the command line or the log).
    ``config_problems``: what keeps the DAG's settings from being used (dag_settings.py);
    any fails the task before anything is submitted."""

    template_fields = ("application_args", "name", "conf")
    ui_color = "#fde9c8"

    def __init__(self, *, application_args: Any, config: str | Path | None = None,
                 spark_conn_id: str = "spark_local", postgres_conn_id: str | None = None,
                 kafka_conn_id: str | None = None, name: str = "{{ dag.dag_id }}",
                 conf: dict[str, str] | None = None,
                 config_problems: tuple[str, ...] | list[str] = (), **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.application = str(deployment.application())
        self.spark_submit = str(deployment.spark_submit())
        self.application_args = application_args
        self.config = str(config) if config else None
        self.spark_conn_id = spark_conn_id
        self.postgres_conn_id = postgres_conn_id
        self.kafka_conn_id = kafka_conn_id
        self.name = name
        self.conf = conf if conf is not None else {"spark.log.level": "WARN"}
        self.config_problems = tuple(config_problems)
        self._process: JobProcess | None = None
        self._outcome = JobOutcome()

    def submit_command(self, summary_file: Path) -> list[str]:
        """The command line, with the Spark connection resolved now, on the worker; the
        packed environment is shipped when the master runs executors elsewhere."""
        target = spark_target(BaseHook.get_connection(self.spark_conn_id))
        conf, archives = dict(self.conf), ""
        if ships_environment(target.master):
            archives = shipped_archive(target.master)
            conf = {**shipped_conf(), **conf}  # a task's own conf wins
            self.log.info("master %s: shipping the job's environment %s", target.master,
                          archives)
        return spark_submit_command(
            target, name=self.name, conf=conf, archives=archives,
            application=self.application,
            application_args=[*self.application_args, "--summary-file", str(summary_file)])

    def execute(self, context: Any) -> dict | None:
        if self.config_problems:
            raise AirflowFailException("; ".join(self.config_problems) + " - not retried")
        codes = self._exit_codes()
        with tempfile.TemporaryDirectory(prefix="pipeline-summary-") as folder:
            summary_file = Path(folder) / "summary.json"
            cmd = self.submit_command(summary_file)
            env = {**os.environ, **deployment.job_env(),
                   **credentials_env(self.postgres_conn_id, self.kafka_conn_id, self.config,
                                     self.log)}
            self.log.info("spark-submit command: %s", readable(cmd))
            self._outcome = JobOutcome(self._datasets(env))
            self._process = JobProcess(cmd, env, self.application, self.log)
            try:
                self._process.start()
            except OSError as e:
                raise AirflowFailException(
                    f"cannot start {cmd[0]} ({e.strerror}): set PIPELINE_VENV to the job's "
                    "virtualenv on this worker (scripts/stack install) - not retried") from None
            code = self._process.wait()
            summary = read_summary(summary_file) if code == 0 else None
        self._outcome = JobOutcome(self._outcome.datasets, code, summary)
        if code != 0:
            fail_for_exit(code, list(self._process.tail), codes, self.log)
        if summary is None:
            self.log.warning("the job succeeded but wrote no summary to %s (in cluster deploy "
                             "mode its driver runs elsewhere): no XCom", summary_file)
        return summary

    def on_kill(self) -> None:
        """Airflow stops the task (timeout, marked failed, worker shutdown): stop the job,
        its driver first (job_process.py)."""
        if self._process is not None:
            self._process.stop()

    def _exit_codes(self) -> job_package.ExitCodes:
        """The job's exit codes, checked before the job starts: without them no exit could
        be told apart."""
        try:
            return job_package.exit_codes()
        except job_package.JobPackageUnavailable as e:
            raise AirflowFailException(f"{e} - not retried") from None

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
        facet (lineage.py)."""
        from pipeline_airflow.lineage import operator_lineage

        outcome = self._outcome
        meaning = "" if outcome.exit_code is None else (
            job_package.exit_codes().meaning(outcome.exit_code))
        return operator_lineage(outcome.datasets, outcome.summary, outcome.exit_code, meaning)

    def get_openlineage_facets_on_failure(self, task_instance: Any) -> Any:
        """The same datasets; the facet tells the job's exit code and that nothing was
        published (a failed job rolls back)."""
        return self.get_openlineage_facets_on_complete(task_instance)
