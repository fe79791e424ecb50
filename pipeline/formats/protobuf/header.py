"""The Confluent wire format's header of a Protobuf value: magic byte 0, a 4-byte
big-endian schema id, then the message indexes (which message of the schema's file the
payload is: a zigzag varint count, then that many zigzag varints, the path from a top-level
message through nested ones; a count of 0 is the common shorthand for [0], the file's first
message), then the message's protobuf bytes.
"""

from __future__ import annotations

from pipeline.formats.refused import Refused

MAGIC = 0
ID_END = 5  # magic byte + schema id
_MAX_DEPTH = 64  # deeper nesting than any real schema: a corrupt count


def _varint(value: bytes, pos: int) -> tuple[int, int]:
    """(the zigzag varint at ``pos``, the position after it); raises IndexError if it
    runs off the end, ValueError if longer than 10 bytes."""
    shift = result = 0
    while True:
        b = value[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return (result >> 1) ^ -(result & 1), pos
        shift += 7
        if shift >= 70:
            raise ValueError("varint longer than 10 bytes")


def header(value: bytes) -> tuple[int, tuple[int, ...], int]:
    """(schema id, message indexes, where the protobuf bytes start); raises Refused."""
    if not value or value[0] != MAGIC:
        if not value:
            raise Refused("corrupt_protobuf", "value is empty: no Confluent wire format "
                          "header (magic byte, schema id, message indexes)")
        raise Refused("bad_magic_byte", f"first byte is 0x{value[0]:02x}, not the Confluent "
                      "wire format's magic byte 0x00: not written by a Confluent Protobuf "
                      "serializer")
    if len(value) <= ID_END:
        raise Refused("corrupt_protobuf", f"value is {len(value)} bytes, too short for the "
                      "Confluent wire format's header (magic byte, 4-byte schema id, "
                      "message indexes)")
    schema_id = int.from_bytes(value[1:ID_END], "big")
    try:
        count, pos = _varint(value, ID_END)
        if count == 0:
            return schema_id, (0,), pos
        if not 0 < count <= _MAX_DEPTH:
            raise ValueError(f"message index count {count}")
        indexes = []
        for _ in range(count):
            i, pos = _varint(value, pos)
            indexes.append(i)
    except (IndexError, ValueError) as e:
        why = "it runs off the end of the value" if isinstance(e, IndexError) else str(e)
        raise Refused("corrupt_protobuf", f"the message indexes after schema id {schema_id} "
                      f"do not parse ({why}): truncated or corrupt") from None
    return schema_id, tuple(indexes), pos


def encode_header(schema_id: int, indexes: tuple[int, ...] = (0,)) -> bytes:
    """The header ``header`` reads (for tests and tools): the [0] shorthand when it fits."""
    out = bytearray([MAGIC]) + schema_id.to_bytes(4, "big")
    items = [] if tuple(indexes) == (0,) else [len(indexes), *indexes]
    for n in items or [0]:
        z = (n << 1) ^ (n >> 63)
        while z > 0x7F:
            out.append(z & 0x7F | 0x80)
            z >>= 7
        out.append(z)
    return bytes(out)
