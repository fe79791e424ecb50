"""Exit codes and the two families of failure.

A *transient* failure (a service unreachable, another run in the way) will probably pass
if the same run is tried again later: schedulers retry it. A *permanent* failure (bad
config, lost data, too many bad records) will fail the same way every time until a person
fixes something: schedulers must not retry it. Either way nothing is committed.

A Spark task's expected failure crosses the executor boundary as a TaskError (below): its
kind says what a retry would do, and the driver turns it into one of the errors above
(spark/errors.py).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from enum import StrEnum

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

# ---- a Spark task's expected failure, as a type (the executors raise it) ----------------
# Spark hands the driver only the text of a failed task's traceback, never the exception
# object. So an executor raises a TaskError, whose text (``str``, the traceback's last line)
# is ONE tagged line holding its fields as JSON, and the driver decodes that line back into a
# TaskError (``decode``) instead of parsing prose. Only this section knows the encoding;
# pipeline/spark/errors.py turns a decoded TaskError into the run's error (one above).


class Kind(StrEnum):
    """What a retry of the whole run would do about it."""

    TRANSIENT = "transient"  # probably pass later: a broker unreachable, records deleted
    PERMANENT = "permanent"  # fail again until someone looks: a truncated log
    CONFIG = "config"  # refused by the broker (credentials, certificate, ACLs)
    # Not the run's failure: a transform's job met records too big for its row-bounded
    # Arrow batches and runs again bounded by bytes (driver/transform_job.py).
    RESIZE = "resize"


# The tag that starts the encoded line; JSON keeps the line one line whatever the message.
TAG = "pipeline-task-error"
_LINE = re.compile(rf"{TAG} (\{{[^\n]*\}})")


@dataclass(frozen=True)
class Where:
    """The Kafka coordinates a task error is about, when it is about one range."""

    topic: str | None = None
    partition: int | None = None
    from_offset: int | None = None
    until_offset: int | None = None


class TaskError(RuntimeError):
    """A Spark task's expected failure: its kind, its one-line message (naming the range
    and the fix) and, when known, the range it was reading."""

    def __init__(self, kind: Kind | str, message: str, where: Where | None = None):
        self.kind = Kind(kind)
        self.message = message
        self.where = where or Where()
        super().__init__(self.encode())

    def __reduce__(self):  # picklable with its fields, whatever a subclass's __init__ takes
        return _rebuild, (type(self), self.kind, self.message, self.where)

    def encode(self) -> str:
        """The single tagged line the driver finds in the task's traceback text."""
        fields = {"kind": self.kind.value, "message": self.message, **asdict(self.where)}
        return f"{TAG} {json.dumps(fields)}"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, TaskError) and (self.kind, self.message, self.where)
                == (other.kind, other.message, other.where))

    __hash__ = RuntimeError.__hash__


def _rebuild(cls: type, kind: Kind, message: str, where: Where) -> TaskError:
    error = TaskError.__new__(cls)
    TaskError.__init__(error, kind, message, where)
    return error


def decode(text: str) -> TaskError | None:
    """The first task error encoded in ``text`` (a failed Spark job's error, which quotes
    the task's traceback, often more than once), or None when there is none."""
    m = _LINE.search(text)
    if m is None:
        return None
    try:
        fields = json.loads(m.group(1))
        where = Where(**{k: fields.get(k) for k in Where.__dataclass_fields__})
        return TaskError(fields["kind"], fields["message"], where)
    except (ValueError, KeyError, TypeError):  # a line cut short: not ours to read
        return None
