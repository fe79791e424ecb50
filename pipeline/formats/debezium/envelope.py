"""What a Debezium change event is, whatever its encoding (json.py: JSON, bare or in Kafka
Connect's schema envelope; avro.py: Avro through Confluent's AvroConverter): its ops (c, r
and u upsert the ``after`` image; d deletes the row its ``before`` image, else its Kafka
key, names; t truncates, a dead letter unless ``[sink] truncate = "apply"``), the
placeholder Debezium sends for an unchanged TOASTed value under ``REPLICA IDENTITY
DEFAULT``, and the semantic type names of its and Kafka Connect's encodings of dates,
timestamps and decimals.

Where a change stands in its source: its ``source_position`` (``source.lsn``, then the
event's ``transaction.total_order``), which orders a key's changes in the upsert
(sinks/upsert.py) so that a change Kafka Connect wrote again after a restart never passes
what followed it; and its source transaction (``transaction_of``: the part of
``transaction.id`` before ':', which is ``source.txId``, and the event's
``data_collection_order``), which a read task summarises when whole transactions are kept
(executor/segments.py). A primary-key change's create names the old key in the header
``__debezium.oldkey`` (``old_key``): a column it leaves out takes the old key's value.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from decimal import Decimal

from pipeline.formats import paths
from pipeline.formats.tombstones import BadTombstone, key_fields
from pipeline.formats.wire.text import NULL, Unstorable, text, unescape

UPSERTS = ("c", "r", "u")
DELETE = "d"
TRUNCATE = "t"
# What Debezium sends for an unchanged TOASTed column (its unavailable.value.placeholder),
# as a string, as a bytea column's bytes (base64 in JSON, bytes in Avro).
UNAVAILABLE = "__debezium_unavailable_value"
UNAVAILABLE_BASE64 = base64.b64encode(UNAVAILABLE.encode()).decode()
_UNAVAILABLE_FORMS = (UNAVAILABLE, UNAVAILABLE_BASE64, UNAVAILABLE.encode())
# Bytes one of those forms leaves in a raw JSON or Avro value: the cheap test first.
UNAVAILABLE_MARKS = (UNAVAILABLE.encode(), UNAVAILABLE_BASE64[:36].encode())
# Debezium's and Kafka Connect's semantic types (the name a schema gives a field): a
# timestamp's epoch unit, a date's days, a NUMERIC without precision.
EPOCH_UNITS = {"io.debezium.time.Timestamp": 1_000,
                "org.apache.kafka.connect.data.Timestamp": 1_000,
                "io.debezium.time.MicroTimestamp": 1_000_000,
                "io.debezium.time.NanoTimestamp": 1_000_000_000}
DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
VARIABLE_SCALE = "io.debezium.data.VariableScaleDecimal"
# The key a format puts a change's source position under in its ``after`` image: read like a
# declared column (the staged ``_source_position``); no JSON key of a source row is it.
POSITION = "\x00source_position"
OLD_KEY = "__debezium.oldkey"  # the header of a primary-key change's create: the old key


def source_position(change: dict) -> str | None:
    """The change's place in its source as the COPY text of a bigint[]: ``{lsn,order}``
    (``source.lsn``, then ``transaction.total_order``), ``{lsn}`` for an event of no
    transaction (a snapshot's read), None when the source names no LSN (a connector other
    than Postgres's: the upsert then orders by Kafka's order alone)."""
    source = change.get("source")
    if type(source) is not dict:
        return None
    lsn = source.get("lsn")
    if type(lsn) is not int:
        return None
    tx = change.get("transaction")
    order = tx.get("total_order") if type(tx) is dict else None
    return f"{{{lsn},{order}}}" if type(order) is int else f"{{{lsn}}}"


def transaction_of(change: dict) -> tuple[str, int] | None:
    """(the source transaction's key, the event's data_collection_order) of a change, None
    for one of no transaction. The key is ``transaction.id`` up to ':' (Debezium 3.6 writes
    ``<txId>:<lsn>``, the LSN each event's own), or all of it where it has no ':'."""
    tx = change.get("transaction")
    if type(tx) is not dict:
        return None
    tid, order = tx.get("id"), tx.get("data_collection_order")
    if type(tid) is not str or type(order) is not int:
        return None
    return tid.partition(":")[0], order


def old_key(m) -> bytes | None:
    """The old key a primary-key change's create names (header ``__debezium.oldkey``)."""
    for name, value in m.headers() or ():
        if name == OLD_KEY:
            return value
    return None


def variable_scale(x) -> Decimal:
    """io.debezium.data.VariableScaleDecimal: {scale, value: the unscaled big-endian two's
    complement bytes (base64 in JSON)} -> its Decimal; raises ValueError, KeyError,
    TypeError."""
    value = x["value"]
    if type(value) is str:
        value = base64.b64decode(value, validate=True)
    if type(value) is not bytes or type(x["scale"]) is not int:
        raise TypeError("not a VariableScaleDecimal")
    return Decimal(int.from_bytes(value, "big", signed=True)).scaleb(-x["scale"])


def is_unavailable(x) -> bool:
    """Debezium's placeholder of an unchanged TOASTed value (an array's: as its one
    element)."""
    if type(x) is list:
        return len(x) == 1 and x[0] in _UNAVAILABLE_FORMS
    return (type(x) is str or type(x) is bytes) and x in _UNAVAILABLE_FORMS


def unavailable(image: dict, columns: Sequence[tuple]) -> tuple[dict, list[str]]:
    """(the image with its placeholder values None, the names of the columns that read
    one); ``columns``: (name, ..., path) of the non-key columns. A column read at a path
    under a placeholder is unavailable too."""
    names, out = [], image
    for name, *_, path in columns:
        try:
            x = paths.lookup(image, path)
        except paths.NotAnObject as e:
            x = e.value
        if x is not None and is_unavailable(x):
            if out is image:
                out = dict(image)
            names.append(name)
            out[path[0]] = None
    return out, names


def holds(image: dict, column: tuple) -> bool:
    """Whether an image holds a key column (at its path, else under its name), as
    tombstones.key_fields looks it up."""
    name, _, _, *source = column
    path = source[0] if source else (name,)
    try:
        x = paths.lookup(image, path)
    except paths.NotAnObject:
        x = None
    return (x if x is not None else image.get(name)) is not None


def old_key_field(m, key_columns: Sequence[tuple]) -> str:
    """The staged ``_old_key`` of a change (a text[] of the old key's fields, in the key's
    order, as COPY text): the key a primary-key change's create names in its header, NULL
    for any other change or a header that does not name the key columns."""
    found = old_key(m)
    if found is None or not key_columns:
        return NULL
    try:
        fields = key_fields(found, key_columns)
        items = ",".join('"' + unescape(f).replace("\\", "\\\\").replace('"', '\\"') + '"'
                         for f in fields)
        return text("{" + items + "}")
    except (BadTombstone, Unstorable):
        return NULL
