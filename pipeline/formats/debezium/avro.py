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
upsert sink keeps the newest change per key (sinks/upsert.newer), so a replay changes
nothing.

Avro's logical types (Connect's Decimal, Date, Timestamp) come out of fastavro typed
already. Debezium's own semantic types are plain longs and ints named by the schema's
``connect.name`` (io.debezium.time.Timestamp, MicroTimestamp, NanoTimestamp, Date) or ISO
strings (ZonedTimestamp): they are decoded by that name, in the images and in the key, so a
timestamp column takes them and a delete names the row as its create wrote it. A NUMERIC
without precision is Debezium's VariableScaleDecimal record {scale, value: bytes}: decoded
into a decimal column.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import date, datetime, timedelta

from pipeline.formats import paths
from pipeline.formats.avro.format import HEADER, MAGIC, AvroFormat, decode_wire
from pipeline.formats.avro.values import avro_kind
from pipeline.formats.debezium.envelope import (
    DATES,
    DELETE,
    EPOCH_UNITS,
    TRUNCATE,
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
from pipeline.formats.refused import Refused
from pipeline.formats.schema_source import SchemaSource
from pipeline.formats.timestamps import EPOCH, kafka_timestamp
from pipeline.formats.tombstones import EVERY_KEY, BadTombstone
from pipeline.formats.types import column_type
from pipeline.formats.wire.text import NULL, TEXT

ZONED = "io.debezium.time.ZonedTimestamp"
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
        if type(t) is dict and type(t.get("connect.name")) is str:
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
    datetime, a date); a value that does not fit its type is left as it is (the column
    rule then refuses it, naming it)."""
    if not kinds:
        return image
    out = dict(image)
    for name, kind in kinds.items():
        x = out.get(name)
        try:
            if kind in EPOCH_UNITS and type(x) is int:
                unit = EPOCH_UNITS[kind]
                seconds, rest = divmod(x, unit)
                out[name] = EPOCH + timedelta(seconds=seconds,
                                              microseconds=rest * 1_000_000 // unit)
            elif kind in DATES and type(x) is int:
                out[name] = _DAY0 + timedelta(days=x)
            elif kind == ZONED and type(x) is str:
                out[name] = datetime.fromisoformat(x)
            elif kind == VARIABLE_SCALE and type(x) is dict:
                out[name] = variable_scale(x)
        except (ValueError, OverflowError, TypeError, KeyError):
            continue
    return out


class DebeziumAvroFormat:
    """``columns``: the declared (name, type, required[, path]) columns, paths relative to
    the row image; ``schemas``: where the writer schemas of values and keys come from;
    ``key``, ``truncate``, the line's fields after the columns and ``sources``: as
    DebeziumFormat's (json.py)."""
    wire = TEXT
    change_events = True  # the Encoder passes ``key`` and ``truncate``

    def __init__(self, columns: Sequence[Sequence], run_id: int,
                 schemas: SchemaSource | None = None, key: Sequence[str] = (),
                 truncate: bool = False):
        self.avro = AvroFormat(columns, run_id, schemas)
        self.schemas = schemas
        self.truncate = truncate
        self.kinds: dict[tuple[int, str], dict[str, str]] = {}  # per writer schema id
        declared = paths.columns(columns)
        self.toastable = [(n, p) for n, _, _, p in declared if n not in key]
        by_name = {c[0]: c for c in declared}
        self.key_columns = [(n, column_type(by_name[n][1]).from_json, by_name[n][1],
                             by_name[n][3]) for n in key if n in by_name]
        self.tail = f"\t{run_id}\n"
        self.sources: dict[int, tuple[str, int]] | None = None

    def change(self, value: bytes, read) -> tuple[str, dict | None, dict | None, int, dict]:
        """(op, after, before, writer schema id, the Envelope record) of one value; raises
        Refused."""
        doc, schema_id, schema = decode_wire(self.schemas, value, read, "value")
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
                if kinds is None:
                    kinds = self.kinds[schema_id, image] = image_types(schema, image)
                x = decode(x, kinds)
            images[image] = x
        if op in UPSERTS and images["after"] is None:
            raise Refused("not_a_change_event", f"op '{op}' without an 'after' image (writer "
                          f"schema id {schema_id})")
        if op not in UPSERTS and op != DELETE and not (self.truncate and op == TRUNCATE):
            raise Refused("unsupported_op", f"op '{op}' is not a row change this sink "
                          "applies (c, r, u upsert; d deletes; t empties the table with "
                          "[sink] truncate = \"apply\")")
        return op, images["after"], images["before"], schema_id, doc

    def fields(self, m, read) -> str | None:
        """An upsert's COPY text fields (its after image's, then its source position, the
        columns it left out: ``_unavailable``, and the old key a primary-key change's create
        names: ``_old_key``), None for a delete or a truncate."""
        value = m.value()
        op, after, _, schema_id, doc = self.change(value, read)
        if self.sources is not None and (tx := transaction_of(doc)) is not None:
            self.sources[m.offset()] = tx
        if op == DELETE or op == TRUNCATE:
            return None
        position = source_position(doc) or NULL
        names: list[str] = []
        if UNAVAILABLE_MARKS[0] in value:
            after, names = unavailable(after, self.toastable)
        if not names:
            return f"{self.avro.project(after, schema_id)}\t{position}\t{NULL}\t{NULL}"
        # Those columns are NULL in the staged row, whatever their 'not null' (the merge
        # keeps the stored values).
        columns = [(k, p, c, r and n not in names, d, n)
                   for k, p, c, r, d, n in self.avro.columns]
        return (f"{self.avro.project(after, schema_id, columns)}\t{position}"
                f"\t{{{','.join(names)}}}\t{old_key_field(m, self.key_columns)}")

    def rows(self, topic: str, partition: int, head: str, records, rejected: list,
             refuse: Callable) -> list[str]:
        """Upserts' result lines; deletes and tombstones go to ``rejected`` (the Encoder
        turns them into deletions of the key ``delete_key`` names), the rest to
        ``refuse`` (refused.decoded_rows' loop, with the record in hand)."""
        from fastavro import schemaless_reader

        rows = []
        append, tail = rows.append, self.tail
        for m in records:
            if m.value() is None:
                rejected.append(m)
                continue
            try:
                got = self.fields(m, schemaless_reader)
            except Refused as e:
                refuse(m, e.error_type, e.message)
                continue
            if got is None:
                rejected.append(m)
            else:
                append(f"{head}{m.offset()}\t{kafka_timestamp(m.timestamp()[1])}\t{got}{tail}")
        return rows

    def delete_key(self, m, key_columns: Sequence[tuple] = ()):
        """The key of the row a delete (or a tombstone) removes (``deletion``'s key)."""
        return self.deletion(m, key_columns)[0]

    def deletion(self, m, key_columns: Sequence[tuple] = ()):
        """(the key of the row a delete, a truncate or a tombstone removes, for
        tombstones.key_fields; its source position, None for a tombstone). The key: a
        delete's ``before`` image when it holds every key column, else the Kafka key
        decoded by its own writer schema (its semantic types too), else the ``before``
        image. A key that is not in the Confluent wire format goes to key_fields as it is
        (a JSON or text key)."""
        from fastavro import schemaless_reader

        before = position = None
        if m.value() is not None:
            op, _, before, _, doc = self.change(m.value(), schemaless_reader)
            position = source_position(doc)
            if op == TRUNCATE:
                return EVERY_KEY, position
            if before and key_columns and all(holds(before, c) for c in key_columns):
                return before, position
        key = m.key()
        if key is None:
            return before, position
        if len(key) < HEADER or key[0] != MAGIC:
            return key, position
        try:
            doc, schema_id, schema = decode_wire(self.schemas, key, schemaless_reader, "key")
        except Refused as e:
            raise BadTombstone(f"has a Kafka key that is not Avro ({e.message})") from None
        if type(doc) is not dict:
            if len(key_columns) != 1:
                raise BadTombstone(f"has a Kafka key that is an Avro {avro_kind(doc)} (writer "
                                   f"schema id {schema_id}), not a record of the key columns")
            return {key_columns[0][0]: doc}, position
        kinds = semantic_types(schema, schema.get("__named_schemas", {}))
        return decode(doc, kinds), position

    def explain(self, m) -> tuple[str, str]:
        return "null_value", "value is null (tombstone)"
