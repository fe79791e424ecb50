"""Debezium change events (``[sink] envelope = "debezium"``, JSON, an upsert sink): each
record is one change of one source row, and the results table holds each row's latest
state.

A value is Debezium's envelope ``{"before", "after", "op", "source", ...}``, bare or inside
Kafka Connect's schema envelope ``{"schema", "payload"}``. ``op`` c (create), r (snapshot
read) and u (update) upsert the ``after`` image, read by the declared columns (their paths
are relative to the image) with the JSON format's rules; d (delete) deletes the row its
``before`` image names (else the Kafka key's), as a tombstone does; the tombstone Debezium
writes after a delete deletes the same key again, which changes nothing. The upsert sink
keeps the newest change per key by offset, so a replay changes nothing.

With the schema envelope, Debezium's encodings of dates, timestamps and decimals (days,
epoch milli/micro/nanoseconds, base64 unscaled bytes) are decoded by the schema's
semantic type names before the column rules apply (a Kafka key's too, by the key's own
schema: a delete names the row as its create wrote it); without it a value is taken as the JSON
it is (so declare such a field ``long``, or have Debezium write ISO strings:
``time.precision.mode = connect`` does not, ``ZonedTimestamp`` does).
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from datetime import date, timedelta
from decimal import Decimal

from pipeline.formats import paths
from pipeline.formats.copy_text import TEXT, Unstorable
from pipeline.formats.documents import json_text
from pipeline.formats.json_format import JsonFormat
from pipeline.formats.timestamps import EPOCH, kafka_timestamp

UPSERTS = ("c", "r", "u")
DELETE = "d"
_DAY0 = date(1970, 1, 1)
# Debezium's and Kafka Connect's semantic types: a JSON value -> what the column rules read.
EPOCH_UNITS = {"io.debezium.time.Timestamp": 1_000,
                "org.apache.kafka.connect.data.Timestamp": 1_000,
                "io.debezium.time.MicroTimestamp": 1_000_000,
                "io.debezium.time.NanoTimestamp": 1_000_000_000}
DATES = ("io.debezium.time.Date", "org.apache.kafka.connect.data.Date")
_DECIMAL = "org.apache.kafka.connect.data.Decimal"


class NotAChange(ValueError):
    """A value that is not a change event this sink applies: (error_type, message)."""


def unwrap(doc):
    """Kafka Connect's JSON with schemas: (payload, schema); without: (doc, None)."""
    if type(doc) is dict and "payload" in doc and "schema" in doc and len(doc) == 2:
        return doc["payload"], doc["schema"]
    return doc, None


def _image_schema(schema, image: str) -> dict[str, dict]:
    """The schema's fields of the ``before`` or ``after`` image, by field name."""
    if type(schema) is not dict:
        return {}
    for f in schema.get("fields") or ():
        if type(f) is dict and f.get("field") == image:
            return {g.get("field"): g for g in f.get("fields") or () if type(g) is dict}
    return {}


def _struct_fields(schema) -> dict[str, dict]:
    """A struct schema's fields by name (a Kafka key's schema)."""
    if type(schema) is not dict:
        return {}
    return {f.get("field"): f for f in schema.get("fields") or () if type(f) is dict}


def decode(image: dict, fields: dict[str, dict]) -> dict:
    """The image with Debezium's semantic encodings decoded (a value that does not fit its
    semantic type is left as it is: the column rule then refuses it)."""
    out = dict(image)
    for name, f in fields.items():
        x = out.get(name)
        kind = f.get("name")
        if x is None or kind is None:
            continue
        try:
            if kind in EPOCH_UNITS and type(x) is int:
                unit = EPOCH_UNITS[kind]
                seconds, rest = divmod(x, unit)
                out[name] = (EPOCH + timedelta(seconds=seconds,
                                               microseconds=rest * 1_000_000 // unit)
                             ).isoformat()
            elif kind in DATES and type(x) is int:
                out[name] = (_DAY0 + timedelta(days=x)).isoformat()
            elif kind == _DECIMAL and type(x) is str:
                scale = int((f.get("parameters") or {}).get("scale", 0))
                unscaled = int.from_bytes(base64.b64decode(x, validate=True), "big",
                                          signed=True)
                out[name] = Decimal(unscaled).scaleb(-scale)
        except (ValueError, OverflowError, TypeError):
            continue
    return out


def change(doc) -> tuple[str, dict | None, dict | None]:
    """(op, after, before) of a parsed value; raises NotAChange."""
    doc, schema = unwrap(doc)
    if type(doc) is not dict or type(doc.get("op")) is not str:
        raise NotAChange("not_a_change_event", "value is not a Debezium change event (no "
                         "'op'; with the schema envelope, no 'payload.op')")
    op = doc["op"]
    images = {}
    for image in ("after", "before"):
        x = doc.get(image)
        if x is not None and type(x) is not dict:
            raise NotAChange("not_a_change_event", f"op '{op}': '{image}' is not an object")
        images[image] = decode(x, _image_schema(schema, image)) if x and schema else x
    if op in UPSERTS and images["after"] is None:
        raise NotAChange("not_a_change_event", f"op '{op}' without an 'after' image")
    if op not in UPSERTS and op != DELETE:
        raise NotAChange("unsupported_op", f"op '{op}' is not a row change this sink applies "
                         "(c, r, u upsert; d deletes)")
    return op, images["after"], images["before"]


class _Image:
    """A record whose value is its change's ``after`` image: what the JSON format reads."""
    __slots__ = ("m", "v")

    def __init__(self, m, v):
        self.m, self.v = m, v

    def value(self):
        return self.v

    def offset(self):
        return self.m.offset()

    def timestamp(self):
        return self.m.timestamp()

    def key(self):
        return self.m.key()

    def headers(self):
        return self.m.headers()


class DebeziumFormat:
    """``columns``: the declared (name, type, required[, path]) columns, paths relative to
    the row image."""
    wire = TEXT

    def __init__(self, columns: Sequence[Sequence], run_id: int):
        self.json = JsonFormat(columns, run_id)
        self.loads = self.json.loads

    def rows(self, topic: str, partition: int, head: str, records, rejected: list,
             refuse: Callable) -> list[str]:
        """Upserts' result lines; deletes and tombstones go to ``rejected`` (the Encoder
        turns them into deletions of the key ``delete_key`` names), the rest to
        ``refuse``."""
        images = []
        for m in records:
            value = m.value()
            if value is None:
                rejected.append(m)
                continue
            try:
                op, after, _ = change(self.loads(value))
            except NotAChange as e:
                refuse(m, *e.args)
                continue
            except Exception:  # noqa: BLE001 - not JSON: the JSON format says why
                refuse(m, *self.json.explain(m))
                continue
            if op == DELETE:
                rejected.append(m)
            else:
                images.append(_Image(m, after))
        bad: list = []
        rows = self.json.encode_rows(images, head, self.json.tail, _same, kafka_timestamp,
                                     *[c for _, c, _, _ in self.json.columns], bad)
        for image in bad:  # explained as the JSON format explains its image's text
            try:
                why = self.json.explain(_Image(image.m, json_text(image.v).encode()))
            except Unstorable as e:
                why = ("unstorable", f"the after image {e}")
            refuse(image.m, *why)
        if self.json.surrogates_possible:  # parsed by the standard library: see JsonFormat
            rows = self.json.utf8_only(rows, records, refuse)
        return rows

    def delete_key(self, m, key_columns: Sequence[tuple] = ()):
        """The key of the row a delete (or a tombstone) removes, for tombstones.key_fields:
        a delete's decoded ``before`` image when it holds every key column (``key_columns``:
        tombstones.key_fields' columns), else the Kafka key, its payload decoded by its own
        schema as the images are (a date key's days name the row its create wrote, as
        ``2022-01-08``), else the ``before`` image."""
        before = None
        if m.value() is not None:
            _, _, before = change(self.loads(m.value()))
            if before and key_columns and all(holds(before, c) for c in key_columns):
                return before
        key = m.key()
        if key is None:
            return before
        try:
            doc, schema = unwrap(self.loads(key))
        except Exception:  # noqa: BLE001 - a bare text key (A-17): key_fields' rules
            return key
        if type(doc) is not dict:
            return key
        return decode(doc, _struct_fields(schema)) if schema else doc

    def explain(self, m) -> tuple[str, str]:
        return "null_value", "value is null (tombstone)"


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


def _same(x):
    return x

