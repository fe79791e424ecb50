"""The content hash of a range's records, as published (pipeline_ranges.content_hash) and as
``pipeline verify`` recomputes it: BLAKE2b (16 bytes) over each record's offset, key and
value, in offset order. A record changed, removed or added, or a topic recreated with other
records at the same offsets, changes it.

It runs on the read's hot path, once per record: one ``update`` of a fixed header (offset,
key and value lengths, -1 for a null) followed by the key and value bytes, so that no two
different records (or a null and an empty value) frame the same bytes. Headers and
timestamps are left out: they are not what the tables are compared on."""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Iterable

DIGEST_BYTES = 16
_HEADER = struct.Struct(">qii").pack


class ContentHash:
    """``h.add(records)`` for each batch in offset order, then ``h.digest()``. ``records``:
    confluent_kafka Messages (anything with offset(), key(), value())."""

    __slots__ = ("_h", "records")

    def __init__(self) -> None:
        self._h = hashlib.blake2b(digest_size=DIGEST_BYTES)
        self.records = 0

    def add(self, records: Iterable) -> None:
        update, header = self._h.update, _HEADER
        n = 0
        for m in records:
            k, v = m.key(), m.value()
            update(header(m.offset(), -1 if k is None else len(k), -1 if v is None else len(v))
                   + (k or b"") + (v or b""))
            n += 1
        self.records += n

    def digest(self) -> bytes:
        return self._h.digest()
