"""A Debezium topic's columns from its writer's schema (``[sink] columns = "schema"``): the
row image's fields (the Envelope's ``after``) as declared column types (formats/types.py),
and the upsert key as the Kafka key's fields. Pure: schemas in, columns out; the driver
finds the schemas (driver/schema_probe.py).

Two encodings of the same Kafka Connect schema: Kafka Connect's JSON schema envelope
(``from_connect``: a field's ``type``, its semantic ``name`` and ``parameters``,
``optional``) and Avro (``from_avro``: the converter keeps the Connect type in
``connect.name`` / ``connect.parameters`` beside Avro's own ``logicalType``; a field is
optional when it is a union with null). The type of a field:

- int8/int16/int32 -> int; int64 -> long; float32/float64 -> double; boolean; string
- Decimal (``scale``, ``connect.decimal.precision``) -> decimal(p,s); without a precision,
  or wider than decimal(p,s) holds, and VariableScaleDecimal (NUMERIC without precision)
  -> decimal (exact, each value its own scale)
- io.debezium.time.Date, Connect's Date -> date; Timestamp, MicroTimestamp, NanoTimestamp,
  ZonedTimestamp, Connect's Timestamp -> timestamp (timestamptz; a zoneless one as UTC)
- io.debezium.data.Json -> jsonb; Uuid, Enum -> string; an array -> array<T> of its
  elements' type (a scalar one)
- optional = false -> not null

Anything else is decided here, never guessed: a text value of another semantic type
(io.debezium.data.Xml, ZonedTime, ...) is a string column, with a warning naming the field
(its text is kept as it is); any other (bytes, a time of day as a number, an interval, a
geometry struct, a map) is Unmapped, naming the field and its type: the driver stops the
run (exit 2) with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.formats.debezium.envelope import (
    CONNECT_DECIMAL,
    DATES,
    EPOCH_UNITS,
    JSON_DOCUMENT,
    VARIABLE_SCALE,
)
from pipeline.formats.types import column_type

ZONED = "io.debezium.time.ZonedTimestamp"
TIMESTAMPS = (*EPOCH_UNITS, ZONED)
STRINGS = ("io.debezium.data.Uuid", "io.debezium.data.Enum")
# The widest decimal(p,s) the column types declare (types._DECIMAL: two digits each).
MAX_DECLARED = 99
_CONNECT_INTS = {"int8": "int", "int16": "int", "int32": "int", "int64": "long"}
_CONNECT_PLAIN = {**_CONNECT_INTS, "float32": "double", "float64": "double",
                  "boolean": "boolean", "string": "string"}
_AVRO_PLAIN = {"int": "int", "long": "long", "float": "double", "double": "double",
               "boolean": "boolean", "string": "string"}
_AVRO_TIMESTAMPS = ("timestamp-millis", "timestamp-micros", "local-timestamp-millis",
                    "local-timestamp-micros")


@dataclass(frozen=True)
class SchemaColumn:
    name: str
    type: str  # a declared column type (formats/types.py)
    required: bool  # optional = false: not null


@dataclass(frozen=True)
class WriterColumns:
    """What a writer's schema says of a topic's table: its columns in the image's field
    order, the key (the Kafka key's fields, in its order; empty when the topic has no key
    schema) and warnings (a field read as a string whose semantic type is not known)."""

    columns: tuple[SchemaColumn, ...]
    key: tuple[str, ...]
    warnings: tuple[str, ...] = ()


class Unmapped(ValueError):
    """A field no column type holds as it is: ``field``, and ``what`` it is."""

    def __init__(self, field: str, what: str):
        super().__init__(f"field '{field}' is {what}, which no column type holds as it is")
        self.field = field
        self.what = what


class NotAnEnvelope(ValueError):
    """A value schema without a row image (not Debezium's Envelope)."""


# ---- Kafka Connect's JSON schema envelope --------------------------------------------

def from_connect(value_schema: dict, key_schema: dict | None) -> WriterColumns:
    """The columns of a JSON change event's value schema (``{"type": "struct", "fields":
    [..., {"field": "after", ...}]}``) and the key of its Kafka key's schema (None: no key);
    raises Unmapped or NotAnEnvelope."""
    after = _connect_image(value_schema)
    warnings: list[str] = []
    # JsonConverter reads a schema without "optional": true as required.
    columns = tuple(SchemaColumn(f["field"], _connect_type(f, f["field"], warnings),
                                 f.get("optional") is not True)
                    for f in after.get("fields") or ())
    return WriterColumns(columns, _connect_key(key_schema), tuple(warnings))


def _connect_image(schema) -> dict:
    if type(schema) is dict and schema.get("type") == "struct":
        for f in schema.get("fields") or ():
            if type(f) is dict and f.get("field") == "after" and f.get("type") == "struct":
                return f
    raise NotAnEnvelope("its schema has no 'after' struct: not a Debezium change event")


def _connect_key(schema) -> tuple[str, ...]:
    if type(schema) is not dict or schema.get("type") != "struct":
        return ()
    return tuple(f["field"] for f in schema.get("fields") or ())


def _connect_type(f: dict, field: str, warnings: list[str]) -> str:
    """A Connect field schema's column type (``field``: its name, for messages)."""
    kind, name = f.get("type"), f.get("name")
    if name == CONNECT_DECIMAL and kind == "bytes":
        params = f.get("parameters") or {}
        return _decimal(params.get("scale"), params.get("connect.decimal.precision"))
    if name == VARIABLE_SCALE and kind == "struct":
        return "decimal"
    if name in DATES and kind == "int32":
        return "date"
    if name in TIMESTAMPS and kind in ("int64", "string"):
        return "timestamp"
    if name == JSON_DOCUMENT and kind == "string":
        return "jsonb"
    if kind == "array":
        items = f.get("items")
        return _array(_connect_type(items, f"{field}[]", warnings) if type(items) is dict
                      else None, field, "an array")
    if kind == "string":
        if name is not None and name not in STRINGS:
            warnings.append(_as_string(field, name))
        return "string"
    if name is None and kind in _CONNECT_PLAIN:
        return _CONNECT_PLAIN[kind]
    raise Unmapped(field, f"{name} ({kind})" if name else f"Connect type {kind}")


# ---- Avro (the AvroConverter's schemas) ----------------------------------------------

def from_avro(value_schema, key_schema) -> WriterColumns:
    """The columns of an Avro change event's writer schema (the Envelope record, parsed by
    fastavro or as JSON) and the key of its Kafka key's writer schema (None: no key);
    raises Unmapped or NotAnEnvelope."""
    named = _named(value_schema)
    after = None
    if type(value_schema) is dict and value_schema.get("type") == "record":
        for f in value_schema.get("fields", ()):
            if f.get("name") == "after":
                after, _ = _optional(f.get("type"), named)
    if type(after) is not dict or after.get("type") != "record":
        raise NotAnEnvelope("its writer schema has no 'after' record: not a Debezium change "
                            "event")
    warnings: list[str] = []
    columns = []
    for f in after.get("fields", ()):
        t, optional = _optional(f.get("type"), named)
        columns.append(SchemaColumn(f["name"], _avro_type(t, f["name"], named, warnings),
                                    not optional))
    key: tuple[str, ...] = ()
    if key_schema is not None:
        record, _ = _optional(key_schema, _named(key_schema))
        if type(record) is dict and record.get("type") == "record":
            key = tuple(f["name"] for f in record.get("fields", ()))
    return WriterColumns(tuple(columns), key, tuple(warnings))


def _named(schema) -> dict:
    """The named types of a schema by full name (fastavro keeps them in
    ``__named_schemas``; a schema read as JSON defines them inline)."""
    if type(schema) is dict and "__named_schemas" in schema:
        return schema["__named_schemas"]
    found: dict = {}

    def walk(s, namespace: str | None) -> None:
        if type(s) is list:
            for branch in s:
                walk(branch, namespace)
        elif type(s) is dict:
            if s.get("type") in ("record", "enum", "fixed") and "name" in s:
                ns = s.get("namespace", namespace)
                full = s["name"] if "." in s["name"] or not ns else f"{ns}.{s['name']}"
                found[full] = s
                found.setdefault(s["name"], s)  # referenced by its short name too
                namespace = ns
            for f in s.get("fields", ()):
                walk(f.get("type"), namespace)
            walk(s.get("items"), namespace)
            walk(s.get("values"), namespace)
    walk(schema, None)
    return found


def _optional(schema, named: dict):
    """(the type without its null branch, a named type resolved; whether null was one)."""
    optional = False
    if type(schema) is list:
        rest = [s for s in schema if s != "null"]
        optional = len(rest) < len(schema)
        schema = rest[0] if len(rest) == 1 else rest
    if type(schema) is str and schema in named:
        schema = named[schema]
    return schema, optional


def _avro_type(t, field: str, named: dict, warnings: list[str]) -> str:
    """An Avro field type's column type (a plain name, or a dict with connect.name and
    logicalType)."""
    if type(t) is str:
        t = {"type": t}
    if type(t) is not dict:
        raise Unmapped(field, f"an Avro union {t}")
    base, name, logical = t.get("type"), t.get("connect.name"), t.get("logicalType")
    if name == VARIABLE_SCALE and base == "record":
        return "decimal"
    if logical == "decimal" and base == "bytes" or name == CONNECT_DECIMAL:
        params = t.get("connect.parameters") or {}
        if name == CONNECT_DECIMAL:
            return _decimal(params.get("scale", t.get("scale")),
                            params.get("connect.decimal.precision"))
        return _decimal(t.get("scale", 0), t.get("precision"))
    if (name in DATES or logical == "date") and base == "int":
        return "date"
    if (name in TIMESTAMPS and base in ("long", "string")
            or logical in _AVRO_TIMESTAMPS and base == "long"):
        return "timestamp"
    if name == JSON_DOCUMENT and base == "string":
        return "jsonb"
    if base == "array":
        items, _ = _optional(t.get("items"), named)
        return _array(_avro_type(items, f"{field}[]", named, warnings), field, "an Avro array")
    if base == "enum":
        return "string"
    if base == "string" and logical in (None, "uuid"):
        if name is not None and name not in STRINGS:
            warnings.append(_as_string(field, name))
        return "string"
    if name is None and logical is None and base in _AVRO_PLAIN:
        return _AVRO_PLAIN[base]
    if name is not None:
        raise Unmapped(field, f"{name} (Avro {base})")
    raise Unmapped(field, f"Avro {base} ({logical})" if logical else f"Avro {base}")


# ---- shared --------------------------------------------------------------------------

def _decimal(scale, precision) -> str:
    """Connect's Decimal: decimal(p,s) when its precision is known and declarable, else
    decimal (exact: nothing is rounded to a scale the source does not have)."""
    try:
        s = int(scale)
        p = int(precision) if precision is not None else None
    except (TypeError, ValueError):
        return "decimal"
    if p is None or not 0 <= s <= p <= MAX_DECLARED or p == 0:
        return "decimal"
    return f"decimal({p},{s})"


def _array(element: str | None, field: str, what: str) -> str:
    if element is None or not column_type(element).scalar:
        raise Unmapped(field, f"{what} of {element or 'an unknown type'}")
    return f"array<{element}>"


def _as_string(field: str, name: str) -> str:
    return (f"field '{field}' is {name}, a semantic type columns = \"schema\" does not know: "
            "read as a string (its text as written)")
