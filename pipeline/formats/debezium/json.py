"""Debezium change events (``[sink] envelope = "debezium"``, JSON, an upsert sink): each
record is one change of one source row, and the results table holds each row's latest
state.

A value is Debezium's envelope ``{"before", "after", "op", "source", ...}``, bare or inside
Kafka Connect's schema envelope ``{"schema", "payload"}``. ``op`` c (create), r (snapshot
read) and u (update) upsert the ``after`` image, read by the declared columns (their paths
are relative to the image) with the JSON format's rules; d (delete) deletes the row its
``before`` image names (else the Kafka key's), as a tombstone does; the tombstone Debezium
writes after a delete deletes the same key again, which changes nothing. t (truncate) is a
dead letter, or with ``[sink] truncate = "apply"`` a deletion of every key (a tombstone
line whose key fields are NULL: sinks/upsert.py places it among the changes around it). The
upsert sink keeps the newest change per key (sinks/upsert.newer), so a replay changes
nothing.

An update under ``REPLICA IDENTITY DEFAULT`` leaves an unchanged TOASTed column out: Debezium
sends its placeholder instead (``__debezium_unavailable_value``; a bytea column's bytes
base64, an array's one element). Such a column is written NULL and named in the row's
``_unavailable`` field (COPY text of a text[]), and the merge keeps the value the row had.

With the schema envelope, Debezium's encodings of dates, timestamps and decimals (days,
epoch milli/micro/nanoseconds, base64 unscaled bytes) are decoded by the schema's
semantic type names before the column rules apply (a Kafka key's too, by the key's own
schema: a delete names the row as its create wrote it); without it a value is taken as the JSON
it is (so declare such a field ``long``, or have Debezium write ISO strings:
``time.precision.mode = connect`` does not, ``ZonedTimestamp`` does). A NUMERIC without
precision (io.debezium.data.VariableScaleDecimal, ``{"scale": s, "value": base64}``) is
decoded into a decimal column by its schema name, or without the schema envelope by that
shape.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Sequence
from datetime import date, timedelta
from decimal import Decimal

from pipeline.formats import paths
from pipeline.formats.debezium.envelope import (
    DATES,
    DELETE,
    EPOCH_UNITS,
    POSITION,
    TRUNCATE,
    UNAVAILABLE_BASE64,
    UNAVAILABLE_MARKS,
    UPSERTS,
    VARIABLE_SCALE,
    holds,
    old_key_field,
    source_position,
    transaction_of,
    unavailable,
    variable_scale,
)
from pipeline.formats.documents import json_text
from pipeline.formats.json.format import JsonFormat
from pipeline.formats.timestamps import EPOCH, kafka_timestamp
from pipeline.formats.tombstones import EVERY_KEY
from pipeline.formats.types import column_type
from pipeline.formats.wire.text import NULL, TEXT, Unstorable

_DAY0 = date(1970, 1, 1)
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
    semantic type is left as it is: the column rule then refuses it; so is the placeholder
    of an unavailable value)."""
    out = dict(image)
    for name, f in fields.items():
        x = out.get(name)
        kind = f.get("name")
        if x is None or kind is None or x == UNAVAILABLE_BASE64:
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
            elif kind == VARIABLE_SCALE and type(x) is dict:
                out[name] = variable_scale(x)
        except (ValueError, OverflowError, TypeError, KeyError):
            continue
    return out


def variable_scale_by_shape(image: dict, columns: Sequence[tuple]) -> dict:
    """Without the schema envelope: a decimal column's ``{"scale": s, "value": base64}``
    (exactly those keys) decoded as a VariableScaleDecimal."""
    out = image
    for _, path in columns:
        try:
            x = paths.lookup(image, path)
        except paths.NotAnObject:
            continue
        if type(x) is dict and x.keys() == {"scale", "value"}:
            try:
                value = variable_scale(x)
            except (ValueError, TypeError, KeyError):
                continue
            out = _replaced(out, path, value)
    return out


def _replaced(doc: dict, path: Sequence[str], value) -> dict:
    """``doc`` with ``value`` at ``path`` (the objects on the way copied, not changed)."""
    out = dict(doc)
    out[path[0]] = value if len(path) == 1 else _replaced(doc[path[0]], path[1:], value)
    return out


def change(doc, truncate: bool = False) -> tuple[str, dict | None, dict | None]:
    """(op, after, before) of a parsed value; ``truncate``: op t is one ([sink] truncate =
    "apply"); raises NotAChange."""
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
    if op not in UPSERTS and op != DELETE and not (truncate and op == TRUNCATE):
        raise NotAChange("unsupported_op", f"op '{op}' is not a row change this sink applies "
                         "(c, r, u upsert; d deletes; t empties the table with [sink] "
                         "truncate = \"apply\")")
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
    the row image; ``key``: the upsert key's columns (never unavailable); ``truncate``: op t
    deletes every key ([sink] truncate = "apply") instead of being a dead letter.

    A row's line is the declared columns', then the change's source position
    (``_source_position``), the columns it left out (``_unavailable``) and the old key a
    primary-key change's create names (``_old_key``), then the run id
    (store/tables.record_rows). ``sources``: None, or a dict the batch loop fills with each
    change's (source transaction, data_collection_order) by offset (Encoder.transactions)."""
    wire = TEXT
    change_events = True  # the Encoder passes ``key`` and ``truncate``

    def __init__(self, columns: Sequence[Sequence], run_id: int, key: Sequence[str] = (),
                 truncate: bool = False):
        declared = paths.columns(columns)
        # The source position is read from the after image like a declared column (the
        # batch loop puts it there): one pass of the row encoder writes it.
        self.columns = [*declared, ("_source_position", "string", False, (POSITION,))]
        self.json = JsonFormat(self.columns, run_id)
        self.loads = self.json.loads
        self.truncate = truncate
        self.run_id = run_id
        self.toastable = [(n, p) for n, _, _, p in declared if n not in key]
        self.decimals = [(n, p) for n, t, _, p in declared
                         if column_type(t).precision is not None]
        by_name = {c[0]: c for c in declared}
        self.key_columns = [(n, column_type(by_name[n][1]).from_json, by_name[n][1],
                             by_name[n][3]) for n in key if n in by_name]
        self.tail = f"\t{NULL}\t{NULL}\t{run_id}\n"  # no column unavailable, no old key
        self._relaxed: dict[tuple[str, ...], JsonFormat] = {}
        self.sources: dict[int, tuple[str, int]] | None = None

    def _without(self, names: tuple[str, ...]) -> JsonFormat:
        """The JSON format with ``names`` not required: an unavailable value is NULL in the
        staged row, and the merge keeps the stored one (a first appearance: NULL)."""
        fmt = self._relaxed.get(names)
        if fmt is None:
            fmt = self._relaxed[names] = JsonFormat(
                [(n, t, r and n not in names, p) for n, t, r, p in self.columns], self.run_id)
        return fmt

    def rows(self, topic: str, partition: int, head: str, records, rejected: list,
             refuse: Callable) -> list[str]:
        """Upserts' result lines; deletes, truncates and tombstones go to ``rejected`` (the
        Encoder turns them into deletions of the key ``delete_key`` names), the rest to
        ``refuse``."""
        images = []
        partial: dict[tuple[str, str], list] = {}  # images with unavailable columns
        sources = self.sources
        for m in records:
            value = m.value()
            if value is None:
                rejected.append(m)
                continue
            try:
                doc = self.loads(value)
                op, after, _ = change(doc, self.truncate)
            except NotAChange as e:
                refuse(m, *e.args)
                continue
            except Exception:  # noqa: BLE001 - not JSON: the JSON format says why
                refuse(m, *self.json.explain(m))
                continue
            payload = unwrap(doc)[0]
            if sources is not None and (tx := transaction_of(payload)) is not None:
                sources[m.offset()] = tx
            if op == DELETE or op == TRUNCATE:
                rejected.append(m)
                continue
            after[POSITION] = source_position(payload)
            if self.decimals and b'"scale"' in value:
                after = variable_scale_by_shape(after, self.decimals)
            if UNAVAILABLE_MARKS[0] in value or UNAVAILABLE_MARKS[1] in value:
                after, names = unavailable(after, self.toastable)
                if names:
                    group = (",".join(names), old_key_field(m, self.key_columns))
                    partial.setdefault(group, []).append(_Image(m, after))
                    continue
            images.append(_Image(m, after))
        rows = self._encode(self.json, images, head, self.tail, refuse)
        for (names, old), some in partial.items():
            rows += self._encode(self._without(tuple(names.split(","))), some, head,
                                 f"\t{{{names}}}\t{old}\t{self.run_id}\n", refuse)
        if self.json.surrogates_possible:  # parsed by the standard library: see JsonFormat
            rows = self.json.utf8_only(rows, records, refuse)
        return rows

    @staticmethod
    def _encode(fmt: JsonFormat, images: list, head: str, tail: str,
                refuse: Callable) -> list[str]:
        bad: list = []
        rows = fmt.encode_rows(images, head, tail, _same, kafka_timestamp,
                               *[c for _, c, _, _ in fmt.columns], bad)
        for image in bad:  # explained as the JSON format explains its image's text
            shown = {k: v for k, v in image.v.items() if k != POSITION}  # the image's own
            try:
                why = fmt.explain(_Image(image.m, json_text(shown).encode()))
            except Unstorable as e:
                why = ("unstorable", f"the after image {e}")
            refuse(image.m, *why)
        return rows

    def delete_key(self, m, key_columns: Sequence[tuple] = ()):
        """The key of the row a delete (or a tombstone) removes (``deletion``'s key)."""
        return self.deletion(m, key_columns)[0]

    def deletion(self, m, key_columns: Sequence[tuple] = ()):
        """(the key of the row a delete, a truncate or a tombstone removes, for
        tombstones.key_fields; its source position, None for a tombstone). The key: a
        delete's decoded ``before`` image when it holds every key column (``key_columns``:
        tombstones.key_fields' columns), else the Kafka key, its payload decoded by its own
        schema as the images are (a date key's days name the row its create wrote, as
        ``2022-01-08``), else the ``before`` image."""
        before = position = None
        if m.value() is not None:
            doc = self.loads(m.value())
            op, _, before = change(doc, self.truncate)
            position = source_position(unwrap(doc)[0])
            if op == TRUNCATE:
                return EVERY_KEY, position
            if before and key_columns and all(holds(before, c) for c in key_columns):
                return before, position
        key = m.key()
        if key is None:
            return before, position
        try:
            doc, schema = unwrap(self.loads(key))
        except Exception:  # noqa: BLE001 - a bare text key (A-17): key_fields' rules
            return key, position
        if type(doc) is not dict:
            return key, position
        return (decode(doc, _struct_fields(schema)) if schema else doc), position

    def explain(self, m) -> tuple[str, str]:
        return "null_value", "value is null (tombstone)"


def _same(x):
    return x

