"""Debezium change events in Avro (``[sink] envelope = "debezium"`` with ``format =
"avro"``, an upsert sink): what Debezium writes through Confluent's AvroConverter. The
value is the Envelope record (``before`` and ``after`` as nullable records of the row's
Value schema, ``op``, ``source``, ``ts_ms``, ...) in the Confluent wire format; the Kafka key
is the row's Key record, Avro too, with a schema id of its own (subject ``<topic>-key``).

The ops are the JSON envelope's (envelope.py, json.py): c, r and u upsert the ``after`` image,
projected to the declared columns by the avro format's rules (paths relative to the image);
d deletes the row its ``before`` image names (else the Kafka key's); the tombstone after a
delete deletes the same key again, which changes nothing; t is a dead letter or, with
``[sink] truncate = "apply"``, deletes every key older than it. An unchanged TOASTed value's
placeholder (a string, or a bytea column's bytes) leaves its column out, as in JSON. The
upsert sink keeps the newest change per key (sinks/upsert.newer); a change Kafka Connect
wrote again after a restart is newer than its original, so with ``[sink] transactions`` it is
left out (plan/transactions.py, ``replays``), never applied again.

Avro's logical types (Connect's Decimal, Date, Timestamp) come out of fastavro typed
already. Debezium's own semantic types are plain longs and ints named by the schema's
``connect.name`` (io.debezium.time.Timestamp, MicroTimestamp, NanoTimestamp, Date) or ISO
strings (ZonedTimestamp): they are decoded by that name, in the images and in the key, so a
timestamp column takes them and a delete names the row as its create wrote it (an array's
elements alike). A NUMERIC without precision is Debezium's VariableScaleDecimal record
{scale, value: bytes}: decoded exactly, into a ``decimal`` column with its own scale (a
``decimal(p,s)`` rounds it). A json or jsonb column (io.debezium.data.Json, the document's
text) is decoded into the document for a jsonb column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta

from pipeline.formats import paths
from pipeline.formats.avro.format import HEADER, MAGIC, AvroFormat, decode_wire
from pipeline.formats.avro.values import avro_kind
from pipeline.formats.debezium import old_key
from pipeline.formats.debezium.envelope import (
    DATES,
    DELETE,
    EPOCH_UNITS,
    JSON_DOCUMENT,
    TRUNCATE,
    UNAVAILABLE_MARKS,
    UPSERTS,
    VARIABLE_SCALE,
    documents,
    holds,
    json_document,
    transaction_of,
    unavailable,
    variable_scale,
)
from pipeline.formats.refused import Refused, decoded_rows
from pipeline.formats.schema_source import SchemaSource
from pipeline.formats.timestamps import EPOCH
from pipeline.formats.tombstones import EVERY_KEY, BadTombstone
from pipeline.formats.wire.text import NULL, TEXT

ZONED = "io.debezium.time.ZonedTimestamp"
ARRAY_OF = "array of "  # semantic_types' kind of an array of a semantic type
_DAY0 = date(1970, 1, 1)


def _branch(schema, named: dict):
    """A field's type without its null branch, a named type's reference resolved."""
    if type(schema) is list:
        rest = [s for s in schema if s != "null"]
        schema = rest[0] if len(rest) == 1 else None
    if type(schema) is str:
        schema = named.get(schema, schema)
    return schema


def semantic_types(record, named: dict) -> dict[str, str]:
    """A record schema's fields that carry a Connect/Debezium semantic type: name ->
    ``connect.name``."""
    record = _branch(record, named)
    if type(record) is not dict or record.get("type") != "record":
        return {}
    out = {}
    for f in record.get("fields", ()):
        t = _branch(f.get("type"), named)
        if type(t) is dict and t.get("type") == "array":  # its elements' type
            items = _branch(t.get("items"), named)
            if type(items) is dict and type(items.get("connect.name")) is str:
                out[f["name"]] = ARRAY_OF + items["connect.name"]
        elif type(t) is dict and type(t.get("connect.name")) is str:
            out[f["name"]] = t["connect.name"]
    return out


def image_types(schema, image: str) -> dict[str, str]:
    """The semantic types of an Envelope's ``before`` or ``after`` image."""
    if type(schema) is not dict:
        return {}
    named = schema.get("__named_schemas", {})
    for f in schema.get("fields", ()):
        if f.get("name") == image:
            return semantic_types(f.get("type"), named)
    return {}


def decode(image: dict, kinds: dict[str, str]) -> dict:
    """The image with Debezium's semantic types decoded to what the avro rules take (a
    datetime, a date, a Decimal, a JSON document); a value that does not fit its type is
    left as it is (the column rule then refuses it, naming it)."""
    if not kinds:
        return image
    out = dict(image)
    for name, kind in kinds.items():
        x = out.get(name)
        if x is None:
            continue
        try:
            out[name] = _decoded(kind, x)
        except (ValueError, OverflowError, TypeError, KeyError, RecursionError):
            continue
    return out


def _decoded(kind: str, x):
    """One value of a semantic type (``ARRAY_OF`` + kind: an array's, element by element);
    raises for a value that does not fit it."""
    if kind in EPOCH_UNITS and type(x) is int:
        unit = EPOCH_UNITS[kind]
        seconds, rest = divmod(x, unit)
        return EPOCH + timedelta(seconds=seconds, microseconds=rest * 1_000_000 // unit)
    if kind in DATES and type(x) is int:
        return _DAY0 + timedelta(days=x)
    if kind == ZONED and type(x) is str:
        return datetime.fromisoformat(x)
    if kind == VARIABLE_SCALE and type(x) is dict:
        return variable_scale(x)
    if kind == JSON_DOCUMENT and type(x) is str:
        return json_document(x)
    if kind.startswith(ARRAY_OF) and type(x) is list:
        element = kind[len(ARRAY_OF):]
        return [None if v is None else _decoded(element, v) for v in x]
    return x


class DebeziumAvroFormat:
    """``columns``: the declared (name, type, required[, path]) columns, paths relative to
    the row image; ``schemas``: where the writer schemas of values and keys come from;
    ``key``, ``truncate``: as DebeziumFormat's."""
    wire = TEXT
    change_events = True  # the Encoder passes ``key`` and ``truncate``

    def __init__(self, columns: Sequence[Sequence], run_id: int,
                 schemas: SchemaSource | None = None, key: Sequence[str] = (),
                 truncate: bool = False):
        self.avro = AvroFormat(columns, run_id, schemas)
        self.schemas = schemas
        self.truncate = truncate
        self.kinds: dict[tuple[int, str], dict[str, str]] = {}  # per writer schema id
        self.toastable = [(n, p) for n, _, _, p in paths.columns(columns) if n not in key]
        self.documents = documents(paths.columns(columns))
        # Encoder.transactions: each change's source transaction by offset, while set.
        self.sources: dict[int, tuple[str, int]] | None = None
        self._transaction: tuple[str, int] | None = None
        self.old_key = old_key.OldKey(paths.columns(columns), key)
        self.no_old_key = f"\t{NULL}{self.old_key.nulls}"  # ``_unavailable`` too
        # rows()' deletes and truncates, by the value's id: (the value, op, before image),
        # for delete_key, until the next batch (the value kept: its id is not reused).
        self._deletes: dict[int, tuple] = {}

    def change(self, value: bytes, read) -> tuple[str, dict | None, dict | None, int]:
        """(op, after, before, writer schema id) of one value; raises Refused."""
        doc, schema_id, schema = decode_wire(self.schemas, value, read, "value")
        if self.sources is not None:
            self._transaction = transaction_of(doc)
        if type(doc) is not dict or type(doc.get("op")) is not str:
            what = "a record without an 'op' field" if type(doc) is dict else (
                f"an Avro {avro_kind(doc)}")
            raise Refused("not_a_change_event", f"value is {what} (writer schema id "
                          f"{schema_id}), not a Debezium change event")
        op = doc["op"]
        images = {}
        for image in ("after", "before"):
            x = doc.get(image)
            if x is not None and type(x) is not dict:
                raise Refused("not_a_change_event", f"op '{op}': '{image}' is an Avro "
                              f"{avro_kind(x)}, not a record (writer schema id {schema_id})")
            if x:
                kinds = self.kinds.get((schema_id, image))
                if kinds is None:  # a JSON document's text is parsed for a jsonb column only
                    kinds = self.kinds[schema_id, image] = {
                        n: k for n, k in image_types(schema, image).items()
                        if k != JSON_DOCUMENT or n in self.documents}
                x = decode(x, kinds)
            images[image] = x
        if op in UPSERTS and images["after"] is None:
            raise Refused("not_a_change_event", f"op '{op}' without an 'after' image (writer "
                          f"schema id {schema_id})")
        if op not in UPSERTS and op != DELETE and not (self.truncate and op == TRUNCATE):
            raise Refused("unsupported_op", f"op '{op}' is not a row change this sink "
                          "applies (c, r, u upsert; d deletes; t empties the table with "
                          "[sink] truncate = \"apply\")")
        return op, images["after"], images["before"], schema_id

    def fields(self, value: bytes, read, m=None) -> str | None:
        """An upsert's COPY text fields (its after image's, then the columns it left out:
        ``_unavailable``, and a primary-key change's old key: old_key.py, from ``m``'s
        headers), None for a delete or a truncate."""
        op, after, before, schema_id = self.change(value, read)
        if op == DELETE or op == TRUNCATE:
            self._deletes[id(value)] = (value, op, before)
            return None
        names: list[str] = []
        if UNAVAILABLE_MARKS[0] in value:
            after, names = unavailable(after, self.toastable)
        if not names:
            return f"{self.avro.project(after, schema_id)}{self.no_old_key}"
        try:
            old = self.old_key.nulls if m is None else self.old_key.fields(m, self.key_document)
        except BadTombstone as e:
            raise Refused(*self.old_key.explain(e)) from None
        # Those columns are NULL in the staged row, whatever their 'not null' (the merge
        # keeps the stored values).
        columns = [(k, p, c, r and n not in names, d, n)
                   for k, p, c, r, d, n in self.avro.columns]
        return f"{self.avro.project(after, schema_id, columns)}\t{{{','.join(names)}}}{old}"

    def rows(self, topic: str, partition: int, head: str, records, rejected: list,
             refuse: Callable) -> list[str]:
        """Upserts' result lines; deletes and tombstones go to ``rejected`` (the Encoder
        turns them into deletions of the key ``delete_key`` names), the rest to
        ``refuse``."""
        from fastavro import schemaless_reader

        self._deletes = {}
        if self.sources is None:  # the record itself: a key change's headers
            return decoded_rows(records, head, self.avro.tail,
                                lambda m: self.fields(m.value(), schemaless_reader, m),
                                rejected, refuse, by_record=True)
        sources = self.sources

        def fields(m):  # and the change's source transaction (a dead letter's too)
            self._transaction = None
            try:
                return self.fields(m.value(), schemaless_reader, m)
            finally:
                if self._transaction is not None:
                    sources[m.offset()] = self._transaction
        return decoded_rows(records, head, self.avro.tail, fields, rejected, refuse,
                            by_record=True)

    def key_document(self, key: bytes):
        """A Kafka key's bytes (a primary-key change's old key: old_key.py) -> the key as
        ``delete_key`` reads one (``_kafka_key``)."""
        return self._kafka_key(key, self.old_key.columns)

    def _kafka_key(self, key: bytes, key_columns: Sequence[tuple]):
        """A Kafka key decoded by its own writer schema (its semantic types too); a key not
        in the Confluent wire format as it is (key_fields' rules: a JSON or text key)."""
        from fastavro import schemaless_reader

        if len(key) < HEADER or key[0] != MAGIC:
            return key
        try:
            doc, schema_id, schema = decode_wire(self.schemas, key, schemaless_reader, "key")
        except Refused as e:
            raise BadTombstone(f"has a Kafka key that is not Avro ({e.message})") from None
        if type(doc) is not dict:
            if len(key_columns) != 1:
                raise BadTombstone(f"has a Kafka key that is an Avro {avro_kind(doc)} (writer "
                                   f"schema id {schema_id}), not a record of the key columns")
            return {key_columns[0][0]: doc}
        return decode(doc, semantic_types(schema, schema.get("__named_schemas", {})))

    def delete_key(self, m, key_columns: Sequence[tuple] = ()):
        """The key of the row a delete (or a tombstone) removes, for tombstones.key_fields:
        a delete's ``before`` image when it holds every key column, else the Kafka key
        decoded by its own writer schema (its semantic types too), else the ``before``
        image. A key that is not in the Confluent wire format goes to key_fields as it is
        (a JSON or text key)."""
        from fastavro import schemaless_reader

        before = None
        value = m.value()
        if value is not None:
            seen = self._deletes.get(id(value))  # the change fields() read: not decoded twice
            if seen and seen[0] is value:
                _, op, before = seen
            else:
                op, _, before, _ = self.change(value, schemaless_reader)
            if op == TRUNCATE:
                return EVERY_KEY
            if before and key_columns and all(holds(before, c) for c in key_columns):
                return before
        key = m.key()
        if key is None:
            return before
        return self._kafka_key(key, key_columns)

    def explain(self, m) -> tuple[str, str]:
        return "null_value", "value is null (tombstone)"
