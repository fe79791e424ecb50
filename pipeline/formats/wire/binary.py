"""COPY binary, the wire encoding of the raw format's rows: each tuple is a field count and
length-prefixed fields in Postgres's binary input forms, so bytes go to bytea as they are,
with no hex to write here or parse in Postgres (2M records: Postgres CPU 13 s less, see
docs/benchmarks.md). The publisher frames the staged tuples with SIGNATURE and TRAILER.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence

# The stream's signature (flags 0, no header extension) and trailer.
SIGNATURE = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
TRAILER = b"\xff\xff"
NULL_FIELD = b"\xff\xff\xff\xff"
# 2000-01-01 UTC in epoch ms: a timestamptz field is microseconds since then.
PG_EPOCH_MS = 946_684_800_000
EMPTY_JSONB_ARRAY = b"\x00\x00\x00\x03\x01[]"  # jsonb's binary input: version 1, then text

pack_i = struct.Struct(">i").pack  # a field's length, or an int4 field's value
pack_q = struct.Struct(">q").pack
pack_iq = struct.Struct(">iq").pack  # an int8 field: its length (8) and value


def text_field(value: str) -> bytes:
    """A text field: its length and UTF-8 bytes."""
    b = value.encode()
    return pack_i(len(b)) + b


class BinaryWire:
    """How a batch of COPY binary tuples becomes one staged blob."""
    binary = True

    @staticmethod
    def blob(rows: Sequence[bytes]) -> bytes:
        return b"".join(rows)


BINARY = BinaryWire()
