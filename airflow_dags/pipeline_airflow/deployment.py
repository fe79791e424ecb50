"""Where the job is on this host, read from the environment when asked, never at import: the
dag-processor that parses the DAGs may lack the job's files, the worker that runs a task
needs them, and a missing one fails that task naming the variable to set.

  PIPELINE_HOME      the folder holding the job's package pipeline/ (its submit.py).
                     Default: where that package is installed in this environment (the
                     wheel's [airflow] extra), else the repository holding airflow_dags/
  PIPELINE_VENV      the job's virtualenv: its bin/spark-submit and bin/python (default
                     $PIPELINE_HOME/.venv)
  PIPELINE_ARCHIVE   the job's packed environment for a cluster's executors (default
                     $PIPELINE_HOME/dist/pipeline-env.tar.gz, built by scripts/package)
  SPARK_LOCAL_IP     the address Spark binds to (default 127.0.0.1)
"""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

# airflow_dags/pipeline_airflow/deployment.py -> the repository
REPOSITORY = Path(__file__).resolve().parents[2]


def job_home() -> Path:
    if home := os.environ.get("PIPELINE_HOME"):
        return Path(home)
    spec = importlib.util.find_spec("pipeline")  # installed here, or loaded from a checkout
    if spec is not None and spec.origin:
        return Path(spec.origin).parent.parent
    return REPOSITORY


def job_venv() -> Path:
    return Path(os.environ.get("PIPELINE_VENV") or job_home() / ".venv")


def application() -> Path:
    """The job's spark-submit entry point."""
    return job_home() / "pipeline" / "submit.py"


def spark_submit() -> Path:
    return job_venv() / "bin" / "spark-submit"


def job_python() -> Path:
    return job_venv() / "bin" / "python"


def archive() -> Path:
    return Path(os.environ.get("PIPELINE_ARCHIVE")
                or job_home() / "dist" / "pipeline-env.tar.gz")


def job_env() -> dict[str, str]:
    """spark-submit's environment on top of the worker's: the driver and the Python workers
    run the job venv's interpreter (psycopg, confluent-kafka live there, not in Airflow's)."""
    python = str(job_python())
    return {"PYSPARK_PYTHON": python, "PYSPARK_DRIVER_PYTHON": python,
            "SPARK_LOCAL_IP": os.environ.get("SPARK_LOCAL_IP", "127.0.0.1")}
