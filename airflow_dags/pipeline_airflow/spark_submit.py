"""The spark-submit command line of one task run: the target a Spark connection names, and
the job's packed environment shipped when that target runs executors on other hosts.
No secret ever goes on it: it is logged, and any user of the host can read a process's
arguments (credentials travel in the environment: connections.py)."""

from __future__ import annotations

import os
import re
import shlex
from dataclasses import dataclass
from typing import Any

from airflow.sdk.exceptions import AirflowFailException

from pipeline_airflow import deployment

# Where Spark unpacks the archive in each executor's working directory (<archive>#job).
ARCHIVE_ALIAS = "job"
SHIP_ENV_MODES = ("auto", "always", "never")


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


def ships_environment(master: str) -> bool:
    """Whether a submission to ``master`` ships the packed environment, as
    PIPELINE_SHIP_ENV says: auto (default) ships it to a standalone cluster (spark://),
    whose executors run on hosts without the job venv or the repository (docs/cluster.md),
    not to local[*], which runs here; always (e.g. YARN in client mode); never (workers
    with the job's environment installed)."""
    mode = os.environ.get("PIPELINE_SHIP_ENV") or "auto"
    if mode not in SHIP_ENV_MODES:
        raise AirflowFailException(
            f"PIPELINE_SHIP_ENV={mode!r} is not one of {', '.join(SHIP_ENV_MODES)}: set it "
            "where the workers get their environment, then clear the task - not retried")
    if mode != "auto":
        return mode == "always"
    return master.startswith("spark://")


def shipped_conf() -> dict[str, str]:
    """What makes the executors' Python workers run the shipped environment. The driver
    runs here, in client mode, with the job venv's python: without
    spark.pyspark.driver.python spark-submit would start it with ./job/bin/python, which
    only exists on the executors."""
    return {"spark.pyspark.python": f"./{ARCHIVE_ALIAS}/bin/python",
            "spark.pyspark.driver.python": str(deployment.job_python())}


def shipped_archive(master: str) -> str:
    """--archives' value (<archive>#job), the archive checked to exist."""
    archive = deployment.archive()
    if not archive.is_file():
        raise AirflowFailException(
            f"the Spark master {master} runs executors on other hosts, which need the job's "
            f"packed environment, and {archive} does not exist: build it with "
            f"'scripts/package' in {deployment.job_home()} (or set PIPELINE_ARCHIVE), then "
            "clear the task - not retried")
    return f"{archive}#{ARCHIVE_ALIAS}"


def spark_submit_command(target: SparkTarget, *, name: str, conf: dict[str, str],
                         archives: str, application: str,
                         application_args: list[str]) -> list[str]:
    """The command line: the job venv's spark-submit of the job's entry point. No --jars:
    the job reads Kafka with its own reader on the executors."""
    cmd = [str(deployment.spark_submit()), "--master", target.master]
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
    if archives:
        cmd += ["--archives", archives]
    return [*cmd, "--name", name, application, *application_args]


def readable(cmd: list[str]) -> str:
    """The command as a person would type it: quoted only where a shell needs it for a
    space or a quote (local[2] stays local[2])."""
    return " ".join(shlex.quote(a) if re.search(r"[\s'\"]", a) or not a else a for a in cmd)
