"""An upsert sink's tombstones: a record with a null value deletes the row its Kafka key
names. The key is read as JSON, typed by the key columns' JSON value rules, so that a
tombstone names exactly the row its key value was written with."""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal

from pipeline.formats import paths
from pipeline.formats.json.values import WrongType
from pipeline.formats.wire.text import Unstorable

_NOT_JSON = object()
# What a format's delete_key returns for a change that deletes every key (Debezium's
# truncate): its tombstone line's key fields are NULL (sinks/upsert.py expands it).
EVERY_KEY = object()
JSON_WHITESPACE = " \t\n\r"  # what JSON ignores around a value (RFC 8259), and so do keys


class BadTombstone(ValueError):
    """A null-valued record whose Kafka key cannot name the row to delete."""


def key_fields(key: bytes | dict | None, columns: Sequence[tuple]) -> list[str]:
    """The business key of an upsert sink's tombstone, from its Kafka key, as COPY text
    fields. ``columns``: (name, converter, declared type[, path]) of the key columns. The
    Kafka key is a JSON object holding them (``{"order_id": 42}``, or at the column's path);
    for a one-column key also a bare
    JSON value (``42``, ``"A-17"``), or, for a string column, any UTF-8 text (``A-17``).
    Whitespace around the key is insignificant in every form, as JSON has it around a
    value: ``"42"\\n``, ``42\\n`` and ``42`` all name the row whose key is '42'."""
    if type(key) is dict and (_flat_keys(key, columns) or _flat(key)):
        return _fields(key, columns)  # as its JSON text would read back
    if type(key) is dict:  # a key document a format found (debezium's before image)
        key = json.dumps(key, default=str).encode()
    if key is None:
        raise BadTombstone("has no Kafka key")
    try:
        as_text = key.decode("utf-8")
    except UnicodeDecodeError:
        raise BadTombstone("has a Kafka key that is not UTF-8") from None
    try:
        doc = json.loads(as_text, parse_float=Decimal)
    except (ValueError, RecursionError):  # RecursionError: nested deeper than json allows
        doc = _NOT_JSON
    if type(doc) is not dict:
        single_string = len(columns) == 1 and columns[0][2] == "string"
        if len(columns) != 1 or (doc is _NOT_JSON and not single_string):
            names = ", ".join(c[0] for c in columns)
            raise BadTombstone(f"has a Kafka key that is not a JSON object with {names}")
        if single_string and type(doc) is not str:
            doc = as_text.strip(JSON_WHITESPACE)  # 42 (or null, or any text) names '42'
        doc = {columns[0][0]: doc}
    return _fields(doc, columns)


def _flat(doc: dict) -> bool:
    """A document of names and JSON's own scalars (no float: its text reads back as a
    Decimal), which json.dumps and json.loads give back as it is."""
    return all(type(k) is str and type(v) in _SCALARS for k, v in doc.items())


_SCALARS = (str, int, bool, type(None))


def _flat_keys(doc: dict, columns: Sequence[tuple]) -> bool:
    """Every key column is a top-level field of ``doc`` holding one of JSON's own scalars:
    all that ``_fields`` reads reads back the same from its JSON text, whatever the other
    fields hold (a Debezium delete's before image: its decimals, its timestamps), so no
    JSON round trip is needed. (The documents here are parsed JSON: their keys are str.)"""
    for name, _, _, *source in columns:
        if source and tuple(source[0]) != (name,):
            return False
        if type(doc.get(name)) not in _SCALARS:
            return False
    return True


def _fields(doc: dict, columns: Sequence[tuple]) -> list[str]:
    """key_fields of a key document."""
    fields = []
    for name, convert, declared, *source in columns:
        # The key's field at the column's path (as in the value), else under its name.
        path = source[0] if source else (name,)
        try:
            x = paths.lookup(doc, path)
        except paths.NotAnObject:
            x = None
        if x is None and path != (name,):
            x = doc.get(name)
        if x is None:
            raise BadTombstone(f"has a Kafka key without '{name}'")
        try:
            fields.append(str(convert(x)))
        except WrongType:
            raise BadTombstone(f"has a Kafka key whose '{name}' is not a {declared}") from None
        except Unstorable as e:
            raise BadTombstone(f"has a Kafka key whose '{name}' {e}") from None
    return fields
