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
upsert sink keeps the newest change per key (sinks/upsert.newer); a change Kafka Connect
wrote again after a restart is newer than its original, so with ``[sink] transactions`` it is
left out (plan/transactions.py, ``replays``), never applied again.

An update under ``REPLICA IDENTITY DEFAULT`` leaves an unchanged TOASTed column out: Debezium
sends its placeholder instead (``__debezium_unavailable_value``; a bytea column's bytes
base64, an array's one element). Such a column is written NULL and named in the row's
``_unavailable`` field (COPY text of a text[]), and the merge keeps the value the row had.

With the schema envelope, Debezium's encodings of dates, timestamps, decimals and JSON
documents (days, epoch milli/micro/nanoseconds, base64 unscaled bytes exactly, a document's
text; an array's elements alike) are decoded by the schema's semantic type names before
the column rules apply (a Kafka key's too, by the key's own
schema: a delete names the row as its create wrote it); without it a value is taken as the JSON
it is (so declare such a field ``long``, or have Debezium write ISO strings:
``time.precision.mode = connect`` does not, ``ZonedTimestamp`` does). A NUMERIC without
precision (io.debezium.data.VariableScaleDecimal, ``{"scale": s, "value": base64}``) is
decoded by its schema name, or without the schema envelope by that shape: exact, with its
own scale, into a ``decimal`` column (into a ``decimal(p,s)`` rounded to s places).

JsonConverter's values are decoded by a plan made once per writer schema, only their
payload parsed (plans.py): the same lines as the whole value's parse, at half its cost.
"""

from __future__ import annotations

import base64
from collections.abc import Callable, Collection, Sequence
from datetime import date, timedelta

from pipeline.formats import paths
from pipeline.formats.debezium import old_key
from pipeline.formats.debezium.envelope import (
    CONNECT_DECIMAL,
    DATES,
    DELETE,
    EPOCH_UNITS,
    JSON_DOCUMENT,
    TRUNCATE,
    UNAVAILABLE_BASE64,
    UNAVAILABLE_MARKS,
    UPSERTS,
    VARIABLE_SCALE,
    documents,
    holds,
    json_document,
    scaled,
    transaction_of,
    unavailable,
    variable_scale,
)
from pipeline.formats.debezium.plans import UNPLANNABLE, Plans, decoded, decoders, floats
from pipeline.formats.documents import json_text
from pipeline.formats.json.format import JsonFormat
from pipeline.formats.timestamps import EPOCH, kafka_timestamp
from pipeline.formats.tombstones import EVERY_KEY, BadTombstone
from pipeline.formats.types import column_type
from pipeline.formats.wire.text import TEXT, Unstorable

_DAY0 = date(1970, 1, 1)
# What of a change's payload is read (change(), transaction_of): a float elsewhere (the
# source block's) changes nothing the full parse would read otherwise.
READ = ("after", "before", "transaction")


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


def decode(image: dict, fields: dict[str, dict], documents: Collection[str] = ()) -> dict:
    """The image with Debezium's semantic encodings decoded (a value that does not fit its
    semantic type is left as it is: the column rule then refuses it; so is the placeholder
    of an unavailable value). ``documents``: the fields a jsonb column reads, whose JSON
    text (io.debezium.data.Json) becomes the document; elsewhere it stays a string."""
    out = dict(image)
    for name, f in fields.items():
        x = out.get(name)
        if x is None or x == UNAVAILABLE_BASE64 or not _semantic(f):
            continue
        if f.get("name") == JSON_DOCUMENT and name not in documents:
            continue
        try:
            out[name] = _decoded(f, x)
        except (ValueError, OverflowError, TypeError, KeyError, RecursionError):
            continue
    return out


def _semantic(f: dict) -> bool:
    """A field whose values Debezium encodes (a named type, or an array of one)."""
    if f.get("name") is not None:
        return True
    items = f.get("items")
    return f.get("type") == "array" and type(items) is dict and items.get("name") is not None


def _decoded(f: dict, x):
    """One value by its field schema's semantic type (an array's, element by element);
    raises for a value that does not fit it."""
    kind = f.get("name")
    if kind in EPOCH_UNITS and type(x) is int:
        unit = EPOCH_UNITS[kind]
        seconds, rest = divmod(x, unit)
        return (EPOCH + timedelta(seconds=seconds, microseconds=rest * 1_000_000 // unit)
                ).isoformat()
    if kind in DATES and type(x) is int:
        return (_DAY0 + timedelta(days=x)).isoformat()
    if kind == CONNECT_DECIMAL and type(x) is str:
        scale = int((f.get("parameters") or {}).get("scale", 0))
        return scaled(int.from_bytes(base64.b64decode(x, validate=True), "big", signed=True),
                      scale)
    if kind == VARIABLE_SCALE and type(x) is dict:
        return variable_scale(x)
    if kind == JSON_DOCUMENT and type(x) is str:
        return json_document(x)
    if kind is None and type(x) is list:  # an array of a semantic type
        return [None if v is None else _decoded(f["items"], v) for v in x]
    return x


def variable_scale_by_shape(image: dict, columns: Sequence[tuple]) -> dict:
    """Without the schema envelope: a decimal column's ``{"scale": s, "value": base64}``
    (exactly those keys) decoded as a VariableScaleDecimal."""
    out = image
    for _, path in columns:
        if len(path) == 1:  # a top-level field: the usual, and no lookup's cost
            x = image.get(path[0])
            if type(x) is not dict:
                continue
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


def change(doc, truncate: bool = False, documents: Collection[str] = ()
           ) -> tuple[str, dict | None, dict | None]:
    """(op, after, before) of a parsed value; ``truncate``: op t is one ([sink] truncate =
    "apply"); ``documents``: decode's; raises NotAChange."""
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
        images[image] = (decode(x, _image_schema(schema, image), documents) if x and schema
                         else x)
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
    deletes every key ([sink] truncate = "apply") instead of being a dead letter."""
    wire = TEXT
    change_events = True  # the Encoder passes ``key`` and ``truncate``

    def __init__(self, columns: Sequence[Sequence], run_id: int, key: Sequence[str] = (),
                 truncate: bool = False):
        self.json = JsonFormat(columns, run_id)
        self.loads = self.json.loads
        self.truncate = truncate
        self.run_id = run_id
        self.columns = paths.columns(columns)
        self.toastable = [(n, p) for n, _, _, p in self.columns if n not in key]
        self.decimals = [(n, p) for n, t, _, p in self.columns if column_type(t).is_decimal]
        self.documents = documents(self.columns)
        self.old_key = old_key.OldKey(self.columns, key)
        self.tail = f"\t\\N{self.old_key.nulls}\t{run_id}\n"  # no column unavailable
        self._relaxed: dict[tuple[str, ...], JsonFormat] = {}
        # Encoder.transactions: each change's source transaction by offset, while set.
        self.sources: dict[int, tuple[str, int]] | None = None
        # The schema envelope's plans per writer schema (plans.py): the rows' (documents
        # decoded for jsonb columns) and delete_key's (as change() without them).
        self.plans = {docs: Plans(self.loads, lambda s, d=docs: _image_plans(s, d))
                       for docs in {self.documents, frozenset()}}
        # A Kafka key's: its fields' decoders (decode(doc, _struct_fields(schema))).
        self.key_plans = Plans(self.loads, lambda s: decoders(_struct_fields(s), (), _decoded))
        # A payload parsed by orjson where the configured parser keeps numbers exact (wide
        # decimals, jsonb) is taken only without a float in what is read of it
        # (plans.floats, READ).
        self._exact = self.json.surrogates_possible
        # rows()' deletes and truncates, by id: (the record, op, before image), for
        # delete_key, until the next batch (the record kept: its id is not reused).
        self._deletes: dict[int, tuple] = {}
        import orjson

        self._payload_loads = orjson.loads

    def change(self, value: bytes, documents: frozenset[str], m=None
               ) -> tuple[str, dict | None, dict | None]:
        """change(self.loads(value), self.truncate, documents), a JsonConverter value's
        images decoded by its schema's plan (plans.py) and only its payload parsed; raises
        as change() (or the parser) does. With the record ``m`` while Encoder.transactions
        collects (``sources``): its source transaction noted first (a dead letter too: its
        END counts it)."""
        plan, payload = self.plans[documents].of(value)
        if plan is not UNPLANNABLE:
            try:
                doc = self._payload_loads(payload)
            except ValueError:  # the full parse says why
                doc = None
            if (type(doc) is dict and type(doc.get("op")) is str
                    and not (self._exact and floats(doc, READ))):
                if m is not None and self.sources is not None and (tx := transaction_of(doc)):
                    self.sources[m.offset()] = tx
                for image, fields in zip(("after", "before"), plan, strict=True):
                    x = doc.get(image)
                    if x and type(x) is dict:
                        doc[image] = decoded(x, fields)
                return change(doc, self.truncate)  # a bare payload: its checks only
        doc = self.loads(value)
        if m is not None and self.sources is not None and (
                tx := transaction_of(unwrap(doc)[0])):
            self.sources[m.offset()] = tx
        return change(doc, self.truncate, documents)

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
        partial: dict[tuple[str, ...], list] = {}  # images with unavailable columns
        self._deletes = {}
        for m in records:
            value = m.value()
            if value is None:
                rejected.append(m)
                continue
            try:
                op, after, before = self.change(value, self.documents, m)
            except NotAChange as e:
                refuse(m, *e.args)
                continue
            except Exception:  # noqa: BLE001 - not JSON: the JSON format says why
                refuse(m, *self.json.explain(m))
                continue
            if op == DELETE or op == TRUNCATE:
                if not self.documents:  # else delete_key's before image is another
                    self._deletes[id(m)] = (m, op, before)
                rejected.append(m)
                continue
            if self.decimals and b'"scale"' in value:
                after = variable_scale_by_shape(after, self.decimals)
            if UNAVAILABLE_MARKS[0] in value or UNAVAILABLE_MARKS[1] in value:
                after, names = unavailable(after, self.toastable)
                if names:
                    try:  # a primary-key change's create: the key the values were under
                        old = self.old_key.fields(m, self.key_document)
                    except BadTombstone as e:
                        refuse(m, *self.old_key.explain(e))
                        continue
                    partial.setdefault((tuple(names), old), []).append(_Image(m, after))
                    continue
            images.append(_Image(m, after))
        rows = self._encode(self.json, images, head, self.tail, refuse)
        for (names, old), some in partial.items():
            rows += self._encode(self._without(names), some, head,
                                 f"\t{{{','.join(names)}}}{old}\t{self.run_id}\n", refuse)
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
            try:
                why = fmt.explain(_Image(image.m, json_text(image.v).encode()))
            except Unstorable as e:
                why = ("unstorable", f"the after image {e}")
            refuse(image.m, *why)
        return rows

    def delete_key(self, m, key_columns: Sequence[tuple] = ()):
        """The key of the row a delete (or a tombstone) removes, for tombstones.key_fields:
        a delete's decoded ``before`` image when it holds every key column (``key_columns``:
        tombstones.key_fields' columns), else the Kafka key, its payload decoded by its own
        schema as the images are (a date key's days name the row its create wrote, as
        ``2022-01-08``), else the ``before`` image."""
        before = None
        if m.value() is not None:
            seen = self._deletes.get(id(m))  # the change rows() read: not parsed twice
            if seen and seen[0] is m:
                _, op, before = seen
            else:
                op, _, before = self.change(m.value(), frozenset())
            if op == TRUNCATE:
                return EVERY_KEY
            if before and key_columns and all(holds(before, c) for c in key_columns):
                return before
        key = m.key()
        if key is None:
            return before
        return self.key_document(key)

    def key_document(self, key: bytes):
        """A Kafka key's bytes (a primary-key change's old key: old_key.py) -> the key as
        ``delete_key`` reads one: its payload decoded by its own schema, else the bytes (a
        bare text key: tombstones.key_fields' rules). JsonConverter's keys by their
        schema's plan, only their payload parsed, as the values (a tombstone's key: ~40%
        of a table's records where rows are deleted)."""
        plan, payload = self.key_plans.of(key)
        if plan is not UNPLANNABLE:
            try:
                doc = self._payload_loads(payload)
            except ValueError:  # the full parse says why
                doc = None
            if type(doc) is dict and not (self._exact and floats(doc)):
                return decoded(doc, plan)
        try:
            doc, schema = unwrap(self.loads(key))
        except Exception:  # noqa: BLE001 - not JSON: key_fields says why it names no key
            return key
        if type(doc) is not dict:
            return key
        return decode(doc, _struct_fields(schema)) if schema else doc

    def explain(self, m) -> tuple[str, str]:
        return "null_value", "value is null (tombstone)"


def _image_plans(schema, documents: frozenset[str]) -> tuple:
    """The after and before images' decoders (plans.decoders) of a parsed schema."""
    return tuple(decoders(_image_schema(schema, image), documents, _decoded)
                 for image in ("after", "before"))


def _same(x):
    return x

