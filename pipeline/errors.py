"""Exit codes and the two families of failure.

A *transient* failure (a service unreachable, another run in the way) will probably pass
if the same run is tried again later: schedulers retry it. A *permanent* failure (bad
config, lost data, too many bad records) will fail the same way every time until a person
fixes something: schedulers must not retry it. Either way nothing is committed.
"""

from __future__ import annotations

EXIT_OK = 0
EXIT_INTERNAL = 1  # a bug: report it
EXIT_CONFIG = 2  # permanent: bad config or arguments
EXIT_DATA = 3  # permanent: data loss, offsets out of range, too many bad records
EXIT_TERMINATED = 143  # SIGTERM: rolled back, safe to rerun (128 + 15)
EXIT_INCOMPLETE = 4  # verify: no mismatch found, but not everything in its scope compared
EXIT_TRANSIENT = 75  # EX_TEMPFAIL: broker/database unreachable, concurrent run; retry later

EXIT_CODES = {
    EXIT_OK: "success (including a run with nothing to read)",
    EXIT_INTERNAL: "internal error (a bug; nothing committed)",
    EXIT_CONFIG: "permanent: bad configuration or arguments (fix the config, do not retry)",
    EXIT_DATA: "permanent: data problem - lost offsets, offsets beyond the topic, "
    "too many bad records; verify: a mismatch (fix, then rerun)",
    EXIT_INCOMPLETE: "verify only: no mismatch, but not everything in its scope was compared "
    "(records Kafka no longer holds); narrow the scope (--skip-lost, --from) to what it holds",
    EXIT_TRANSIENT: "transient: Kafka or Postgres unreachable, or another run in the way "
    "(retry later)",
    EXIT_TERMINATED: "terminated by SIGTERM/SIGINT; rolled back, safe to rerun (retry)",
}

RETRYABLE_EXIT_CODES = frozenset({EXIT_TRANSIENT, EXIT_TERMINATED})


class PipelineError(Exception):
    """An expected failure with a one-line message that says what to fix."""

    exit_code = EXIT_INTERNAL
    kind = "error"

    def __init__(self, message: str):
        super().__init__(message)
        self.message = message


class ConfigError(PipelineError):
    exit_code = EXIT_CONFIG
    kind = "config"


class SparkStartError(ConfigError):
    """Spark would not start: a configuration error, unless the run was being stopped (a
    stop signal, or spark-submit's death, breaks the start-up too: driver/signals.py)."""


class DataError(PipelineError):
    """Permanent: what Kafka holds contradicts what we stored, or the input is too bad."""

    exit_code = EXIT_DATA
    kind = "data"


class IncompleteError(PipelineError):
    """``pipeline verify`` found no mismatch, but could not compare everything in its scope
    (records Kafka no longer holds): not a match, and not a retry's to fix."""

    exit_code = EXIT_INCOMPLETE
    kind = "incomplete"


class TransientError(PipelineError):
    exit_code = EXIT_TRANSIENT
    kind = "transient"


class ConflictError(TransientError):
    """Another run holds the pipeline or already published the range: nothing committed."""

    kind = "conflict"


class Terminated(PipelineError):
    exit_code = EXIT_TERMINATED
    kind = "terminated"
