"""The job's own package (pipeline/), the one source of two things the DAGs need: the model
of the [airflow] table (pipeline/settings/airflow.py), which checks each config's table and
the PIPELINE_* defaults when the DAGs are parsed, and the exit codes (pipeline/errors.py),
which decide a task's state when the job has ended.

One way to reach it, in this order:
  1. a normal import, where the package is installed in Airflow's environment (the wheel
     with its [airflow] extra);
  2. otherwise the package in PIPELINE_HOME (deployment.py): a checkout beside Airflow's
     own venv, as this repository runs it (.airflow-venv has Airflow's pins, not the
     job's). It is imported as the package ``pipeline`` from that folder alone, nothing
     else of the folder joins sys.path.
Neither: JobPackageUnavailable, whose message says what to install or set.
"""

from __future__ import annotations

import importlib
import importlib.machinery
import importlib.util
import sys
from dataclasses import dataclass
from types import ModuleType
from typing import Any

from pipeline_airflow.deployment import job_home

PACKAGE = "pipeline"


class JobPackageUnavailable(Exception):
    """The job's package cannot be imported in this process."""


class AirflowTableError(ValueError):
    """A value the job's [airflow] model refuses; the message is the job's own line."""


def job_module(name: str) -> ModuleType:
    """``pipeline.<...>``, imported from wherever the job's package is (see above)."""
    if PACKAGE not in sys.modules and importlib.util.find_spec(PACKAGE) is None:
        _load_from_home()
    try:
        return importlib.import_module(name)
    except ImportError as e:  # e.g. a dependency of the job missing from this environment
        raise JobPackageUnavailable(
            f"the job's {name} cannot be imported here ({type(e).__name__}: {e}): install the "
            "job's wheel with its [airflow] extra in Airflow's environment") from None


def _load_from_home() -> None:
    home = job_home()
    spec = importlib.machinery.PathFinder.find_spec(PACKAGE, [str(home)])
    if spec is None or spec.loader is None:
        raise JobPackageUnavailable(
            f"the job's package is not installed here and PIPELINE_HOME={home} holds no "
            f"{PACKAGE}/: set PIPELINE_HOME to the job's checkout (or its site-packages), or "
            "install the job's wheel with its [airflow] extra in Airflow's environment")
    module = importlib.util.module_from_spec(spec)
    sys.modules[PACKAGE] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[PACKAGE]
        raise


# ---- the [airflow] table -------------------------------------------------------------------

def airflow_keys() -> list[str]:
    """The keys the job's model has, in its order."""
    return list(job_module("pipeline.settings.airflow").AirflowTable.model_fields)


def airflow_table(table: Any) -> dict[str, Any]:
    """A config's [airflow] table as the job's model reads it: the keys it sets, checked;
    AirflowTableError with the job's one line (naming the key) if it has a mistake."""
    model = _check(table, strict=True)
    return model.model_dump(exclude_none=True)


def airflow_value(key: str, text: str) -> Any:
    """A PIPELINE_* default of [airflow] ``key``, given as text ("5"), checked by the model."""
    return getattr(_check({key: text}, strict=False), key)


def _check(table: Any, *, strict: bool) -> Any:
    settings = job_module("pipeline.settings.airflow")
    config_error = job_module("pipeline.errors").ConfigError
    try:
        return settings.airflow_table(table, strict=strict)
    except config_error as e:
        raise AirflowTableError(e.message) from None


# ---- the exit codes ------------------------------------------------------------------------

@dataclass(frozen=True)
class ExitCodes:
    """pipeline/errors.py's table: what each code means, and which ones a retry may fix."""
    meanings: dict[int, str]
    retryable: frozenset[int]

    def meaning(self, code: int) -> str:
        return self.meanings.get(code, "unknown exit code")


def exit_codes() -> ExitCodes:
    errors = job_module("pipeline.errors")
    return ExitCodes(dict(errors.EXIT_CODES), frozenset(errors.RETRYABLE_EXIT_CODES))
