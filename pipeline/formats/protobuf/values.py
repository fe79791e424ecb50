"""The protobuf format's value rules: a field of a decoded message -> the Python value the
declared column's Avro rule takes (avro/values.py, via types.py's ``from_avro``), so both
schema formats store a value the same way.

Scalars are already Python values (int64/uint32/sint64/fixed... -> int, float/double ->
float, bool, string, bytes); an enum becomes its value's name (a string column), or its
number if the writer's enum lacks it. Well-known types: google.protobuf.Timestamp -> a UTC
datetime (a timestamp column, timestamptz); the wrappers (Int64Value, StringValue, ...) ->
their value. A field without presence (a proto3 scalar not marked ``optional``) that was
not set is its default (0, "", false), as every protobuf reader sees it; a field with
presence (``optional``, a message, a oneof member) that was not set is null. A repeated
field is a list (an ``array<T>`` column, element by element), a map a dict and any other
message its proto3 JSON mapping as a dict (a ``jsonb`` column). A column's ``from`` path
walks singular message fields by name.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC

_WRAPPERS = {f"google.protobuf.{n}Value" for n in
             ("Double", "Float", "Int64", "UInt64", "Int32", "UInt32", "Bool", "String",
              "Bytes")}
TIMESTAMP = "google.protobuf.Timestamp"


def _type_names() -> dict[int, str]:
    from google.protobuf.descriptor import FieldDescriptor

    return {v: k[5:].lower() for k, v in vars(FieldDescriptor).items()
            if k.startswith("TYPE_")}


def kind(field) -> str:
    """What a field is, in protobuf's words, for a wrong_type message."""
    if field.message_type is not None:
        if field.message_type.GetOptions().map_entry:
            return "map"
        what = f"message {field.message_type.full_name}"
    elif field.enum_type is not None:
        what = f"enum {field.enum_type.full_name}"
    else:
        what = _type_names().get(field.type, "unknown")
    return f"repeated {what}" if _repeated(field) else what


def _repeated(field) -> bool:
    # FieldDescriptor.is_repeated is new (protobuf 5.x); label is the older spelling.
    flag = getattr(field, "is_repeated", None)
    return flag if isinstance(flag, bool) else field.label == field.LABEL_REPEATED


def _scalar(field) -> Callable[[object], object]:
    """One stored value (of a set field, or a repeated field's element) -> the Python value
    the Avro rules take."""
    message = field.message_type.full_name if field.message_type is not None else None
    if message == TIMESTAMP:
        return lambda v: v.ToDatetime(tzinfo=UTC)
    if message in _WRAPPERS:
        return lambda v: v.value
    if message is not None:
        from google.protobuf.json_format import MessageToDict

        # Only a jsonb column takes it (the proto3 JSON mapping, field names as written).
        return lambda v: MessageToDict(v, preserving_proto_field_name=True)
    if field.enum_type is not None:
        names = {v.number: v.name for v in field.enum_type.values}
        return lambda v: names.get(v, v)
    return lambda v: v


def getter(field) -> Callable:
    """A function: message -> the field's Python value, or None when unset (with
    presence). A repeated field is a list (an array<T> column), a map a dict (jsonb)."""
    name = field.name
    if _repeated(field):
        if field.message_type is not None and field.message_type.GetOptions().map_entry:
            value = _scalar(field.message_type.fields_by_name["value"])
            return lambda msg: {k: value(v) for k, v in getattr(msg, name).items()}
        one = _scalar(field)
        return lambda msg: [one(v) for v in getattr(msg, name)]
    convert = _scalar(field)
    if field.has_presence:
        return lambda msg: convert(getattr(msg, name)) if msg.HasField(name) else None
    return lambda msg: convert(getattr(msg, name))


class NotAMessage(ValueError):
    """A column's path runs through a field that is not a (singular) message."""

    def __init__(self, where: tuple[str, ...], field):
        super().__init__(".".join(where))
        self.where = where
        self.field = field


def path_getter(descriptor, path: tuple[str, ...]):
    """(a function: message -> the value at ``path``, the last field), or None when the
    writer's message has no such path; raises NotAMessage for a path through a scalar,
    a repeated field or a map. An unset message on the way is a missing value (None)."""
    steps = []
    for i, part in enumerate(path):
        field = descriptor.fields_by_name.get(part)
        if field is None:
            return None
        if i == len(path) - 1:
            break
        if field.message_type is None or _repeated(field):
            raise NotAMessage(path[:i + 1], field)
        steps.append(part)
        descriptor = field.message_type
    last = getter(field)
    if not steps:
        return last, field

    def walk(msg):
        for part in steps:
            if not msg.HasField(part):
                return None
            msg = getattr(msg, part)
        return last(msg)
    return walk, field
