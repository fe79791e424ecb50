"""A record a schema format (avro, protobuf) refuses: the dead letter's error type and
message, raised while decoding one value and caught by the format's batch loop."""

from __future__ import annotations

from collections.abc import Callable

from pipeline.formats import paths
from pipeline.formats.binary_fields import kafka_millis
from pipeline.formats.timestamps import kafka_timestamp
from pipeline.formats.wire.binary import pack_iq
from pipeline.formats.wire.text import Unstorable


class Refused(ValueError):
    """A record that is not a result row: its dead letter's error type and message."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type
        self.message = message


def unconvertible(e: Exception, name: str, path: tuple[str, ...], schema_id: int,
                  declared: str, got: str) -> Refused:
    """The Refused of a value its column's converter raised on: Unstorable (Postgres cannot
    store it), else WrongType (the writer's ``got`` kind is not the ``declared`` type)."""
    if isinstance(e, Unstorable):
        return Refused("unstorable", f"field {paths.field(name, path)} {e}")
    detail = f": {e}" if str(e) else ""
    return Refused("wrong_type", f"field {paths.field(name, path)} (writer schema id "
                   f"{schema_id}): expected {declared}, got {got}{detail}")


def decoded_rows(records, head, tail, fields: Callable[[bytes], str | bytes | None],
                 rejected: list, refuse: Callable, binary: bool = False,
                 by_record: bool = False) -> list:
    """A schema format's batch loop: each value's ``fields`` (raising Refused) as one
    result row; a null value, or one whose ``fields`` are None (a Debezium delete), goes to
    ``rejected`` (a deletion: the Encoder's), every other bad record to ``refuse`` with its
    reason. Rows are COPY text lines, or with ``binary`` COPY binary tuples (``head``: a
    tuple's field count, topic and partition fields; ``fields``: the value's binary fields,
    binary_fields.py); ``by_record``: ``fields`` takes the record, not its value."""
    rows = []
    append = rows.append
    for m in records:
        value = m.value()
        if value is None:
            rejected.append(m)
            continue
        try:
            got = fields(m if by_record else value)
        except Refused as e:
            refuse(m, e.error_type, e.message)
            continue
        if got is None:
            rejected.append(m)
        elif binary:
            append(b"".join((head, pack_iq(8, m.offset()), kafka_millis(m.timestamp()[1]),
                             got, tail)))
        else:
            append(f"{head}{m.offset()}\t{kafka_timestamp(m.timestamp()[1])}\t{got}{tail}")
    return rows
