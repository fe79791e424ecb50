"""A dead letter's line, whatever the record's format: its coordinates, original bytes,
headers and timestamp, and why it is not a result row, as COPY text in the order of
store.tables.DEAD_LETTER_FIELDS."""

from __future__ import annotations

from pipeline.formats.timestamps import TimestampOutOfRange, kafka_timestamp
from pipeline.formats.wire.text import NULL, bytea, headers_escaped, headers_json, text

UNEXPECTED = "unexpected_error"


def dead_line(head: str, m, error_type: str, message: str) -> str:
    """A dead letter (``head``: topic and partition as COPY text, each followed by a tab);
    whatever the record holds, this line can be written."""
    try:
        headers = headers_json(m.headers())
    except Exception:  # noqa: BLE001 - a NUL in a key (jsonb refuses it), or anything
        headers = headers_escaped(m.headers())
    try:
        timestamp = kafka_timestamp(m.timestamp()[1])
    except TimestampOutOfRange:
        timestamp = NULL  # the record's timestamp is in the message
    return (f"{head}{m.offset()}\t{bytea(m.key())}\t{bytea(m.value())}\t{headers}\t"
            f"{timestamp}\t{text(error_type)}\t{text(message)}\n")


def unexpected(e: BaseException, doing: str) -> tuple[str, str]:
    """(error_type, error_message) of a record whose handling raised what nothing expected
    (a bug, a parser's limit, memory): the record is a dead letter naming the exception,
    kept for inspection and replay, and the run goes on."""
    what = str(e)
    if len(what) > 500:
        what = what[:500] + "..."
    return UNEXPECTED, f"{doing} raised {type(e).__name__}: {what}"
