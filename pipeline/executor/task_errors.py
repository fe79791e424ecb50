"""Errors that cross the executor boundary: a Spark task's expected failure, as a type.

Spark hands the driver only the text of a failed task's traceback, never the exception
object. So an executor raises a TaskError, whose text (``str``, the traceback's last line)
is ONE tagged line holding its fields as JSON, and the driver decodes that line back into a
TaskError (``decode``) instead of parsing prose. This module is the only place that knows
the encoding; pipeline/spark/errors.py turns a decoded TaskError into the run's error.
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from enum import StrEnum


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
