"""What a Debezium change event is, whatever its encoding (json.py: JSON, bare or in Kafka
Connect's schema envelope; avro.py: Avro through Confluent's AvroConverter): its ops (c, r
and u upsert the ``after`` image; d deletes the row its ``before`` image, else its Kafka
key, names; t truncates, a dead letter unless ``[sink] truncate = "apply"``), the
placeholder Debezium sends for an unchanged TOASTed value under ``REPLICA IDENTITY
DEFAULT``, and the semantic type names of its and Kafka Connect's encodings of dates,
timestamps, decimals and JSON documents.

A change's source transaction (``transaction_of``: the part of ``transaction.id`` before
':', which is ``source.txId``, and the event's ``data_collection_order``) is what a read
task summarises when whole source transactions are kept (executor/segments.py).
"""

from __future__ import annotations

import base64
import json
from binascii import a2b_base64
from collections.abc import Sequence
from decimal import Decimal

from pipeline.formats import paths
from pipeline.formats.types import column_type

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
CONNECT_DECIMAL = "org.apache.kafka.connect.data.Decimal"
# A json or jsonb column: the document's text, as a string.
JSON_DOCUMENT = "io.debezium.data.Json"


def scaled(unscaled: int, scale: int) -> Decimal:
    """unscaled * 10**-scale, exactly, with that scale (Decimal.scaleb would round to the
    context's 28 digits)."""
    return Decimal(f"{unscaled}E{-scale}")


def transaction_of(change) -> tuple[str, int] | None:
    """(the source transaction's key, the event's data_collection_order) of a change's
    payload, None for one of no transaction (a snapshot's read). The key is
    ``transaction.id`` up to ':' (Debezium 3.6 writes ``<txId>:<lsn>``, the LSN each event's
    own), or all of it where it has no ':'."""
    tx = change.get("transaction") if type(change) is dict else None
    if type(tx) is not dict:
        return None
    tid, order = tx.get("id"), tx.get("data_collection_order")
    if type(tid) is not str or type(order) is not int:
        return None
    return tid.partition(":")[0], order


def variable_scale(x) -> Decimal:
    """io.debezium.data.VariableScaleDecimal: {scale, value: the unscaled big-endian two's
    complement bytes (base64 in JSON)} -> its Decimal, exactly; raises ValueError,
    KeyError, TypeError."""
    value = x["value"]
    if type(value) is str:
        try:  # what strict mode takes, b64decode(validate=True) reads the same, faster
            value = a2b_base64(value, strict_mode=True)
        except ValueError:  # it decides (and raises) for anything else
            value = base64.b64decode(value, validate=True)
    if type(value) is not bytes or type(x["scale"]) is not int:
        raise TypeError("not a VariableScaleDecimal")
    return scaled(int.from_bytes(value, "big", signed=True), x["scale"])


def json_document(x: str):
    """io.debezium.data.Json's text -> the document, its numbers exactly as written (a
    jsonb column stores the document, not a string holding it); raises ValueError."""
    return json.loads(x, parse_float=Decimal)


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


def documents(columns: Sequence[tuple]) -> frozenset[str]:
    """The image's fields a jsonb column reads whole ((name, type, required, path)
    columns): their io.debezium.data.Json text is decoded into the document."""
    return frozenset(p[0] for _, t, _, p in columns
                     if len(p) == 1 and column_type(t).pg == "jsonb")
