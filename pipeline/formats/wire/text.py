"""COPY text, the wire encoding of the JSON format's rows, of tombstones and of every dead
letter: tab-separated fields, backslash escapes, ``\\N`` for NULL.

Postgres parses COPY text in C; everything here only has to write what it reads back
exactly (see tests/integration/test_bad_input.py's catalogue).
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Sequence

NULL = "\\N"


class Unstorable(ValueError):
    """A value Postgres would refuse (a NUL character in text): the record becomes a dead
    letter instead of failing the whole COPY on every rerun."""


def text(value: str) -> str:
    """One COPY text field; Postgres text cannot hold NUL."""
    if "\\" in value or "\t" in value or "\n" in value or "\r" in value:
        value = (value.replace("\\", "\\\\").replace("\t", "\\t").replace("\n", "\\n")
                 .replace("\r", "\\r"))
    if "\x00" in value:
        raise Unstorable("contains a NUL character (\\u0000), which Postgres text cannot store")
    return value


_ESCAPES = {"\\": "\\", "t": "\t", "n": "\n", "r": "\r"}
_ESCAPED = re.compile(r"\\(.)")


def unescape(field: str) -> str:
    """A COPY text field's string (``text`` undone)."""
    if "\\" not in field:
        return field
    return _ESCAPED.sub(lambda m: _ESCAPES.get(m.group(1), m.group(1)), field)


def escape(value: str) -> str:
    """COPY text escaping of one field that is known to hold no NUL (a message we wrote)."""
    return (value.replace("\\", "\\\\").replace("\n", "\\n").replace("\r", "\\r")
            .replace("\t", "\\t"))


def bytea(value: bytes | None) -> str:
    return NULL if value is None else "\\\\x" + value.hex()


def headers_json(headers: Sequence[tuple[str, bytes | None]] | None) -> str:
    """The headers as a COPY text field (see headers_plain)."""
    return "[]" if not headers else text(headers_plain(headers))


def headers_plain(headers: Sequence[tuple[str, bytes | None]]) -> str:
    """Headers as Spark's Kafka source + to_json has them: [{"key", "value_b64"}], the value
    base64 (bytes need not be UTF-8), a null value without "value_b64"."""
    out = []
    for key, value in headers:
        if "\x00" in key:  # jsonb refuses \u0000
            raise Unstorable("contains a NUL character (\\u0000), which jsonb cannot store")
        item = {"key": key}
        if value is not None:
            item["value_b64"] = base64.b64encode(value).decode()
        out.append(item)
    return json.dumps(out, ensure_ascii=False, separators=(",", ":"))


def headers_escaped(headers: Sequence[tuple[str, bytes | None]]) -> str:
    """Headers whose keys jsonb cannot store (a NUL): the keys kept as base64 too."""
    return text(json.dumps([{"key_b64": base64.b64encode(k.encode()).decode(),
                             "value_b64": None if v is None else base64.b64encode(v).decode()}
                            for k, v in headers]))


class TextWire:
    """How a batch of COPY text lines becomes one staged blob."""
    binary = False

    @staticmethod
    def blob(lines: Sequence[str]) -> bytes:
        return "".join(lines).encode()


TEXT = TextWire()
