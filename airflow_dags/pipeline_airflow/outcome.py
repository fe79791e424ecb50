"""What a finished job means for its task. Read from the process and the job's summary
file, never from log text: the exit code decides the state (0 success, a retryable code a
retry, any other a failure that is not retried), the job's one-line error is the failure
message, and the summary the job wrote to the file the operator named (--summary-file) is
the task's XCom."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from airflow.sdk.exceptions import AirflowException, AirflowFailException

from pipeline_airflow.job_package import ExitCodes


class PipelineTransientError(AirflowException):
    """The job exited with a retryable code (75 transient, 143 terminated): Airflow retries."""


@dataclass(frozen=True)
class JobOutcome:
    """What one task run learnt, for the OpenLineage facets: the datasets (known before
    the job starts), the job's exit code (None: it never ran) and its summary (on
    success)."""
    datasets: dict[str, Any] = field(default_factory=dict)
    exit_code: int | None = None
    summary: dict[str, Any] | None = None


def read_summary(path: Path) -> dict[str, Any] | None:
    """The summary the job wrote (it replaces the file whole), or None if it wrote none."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return None


def last_error_line(lines: list[str]) -> str:
    """The job's one-line error (cli.py prints 'error: ...' before exiting), else the last
    line it printed."""
    for line in reversed(lines):
        if line.startswith("error: "):
            return line
    return next((line for line in reversed(lines) if line.strip()), "(no output)")


def fail_for_exit(code: int, lines: list[str], codes: ExitCodes, log: Any) -> None:
    """Raise what the job's non-zero exit ``code`` means for the task: a retryable one
    PipelineTransientError (Airflow retries it), any other AirflowFailException (no retry:
    a person must fix something first), both with the job's error line."""
    error, meaning = last_error_line(lines), codes.meaning(code)
    if code in codes.retryable:
        log.warning("pipeline exited %d (%s): %s", code, meaning, error)
        raise PipelineTransientError(f"pipeline exited {code} ({meaning}): {error}")
    log.error("pipeline exited %d (%s): %s", code, meaning, error)
    raise AirflowFailException(f"pipeline exited {code} ({meaning}): {error} - not retried")
