"""The content hash of a range's records, as published (pipeline_ranges.content_hash) and as
``pipeline verify`` recomputes it: BLAKE2b (16 bytes) over each record's offset, key and
value, in offset order. A record changed, removed or added, or a topic recreated with other
records at the same offsets, changes it.

It runs on the read's hot path, once per record: one ``update`` of a fixed header (offset,
key and value lengths, -1 for a null) followed by the key and value bytes, so that no two
different records (or a null and an empty value) frame the same bytes. Headers and
timestamps are left out: they are not what the tables are compared on.

A run with a [sink] transform hashes with ContentHash too (its input is the built-in read,
executor/transform/feed.py). Ledger rows of transform runs from before that carry another kind
(``hash_kind``): ``md5sum``, the sum modulo 2**128 of each record's MD5 over the same
framing, which Spark SQL computed where Spark's Kafka source read, combined across however
Spark split a range; verify still recomputes it for them (RecordSum). A changed, removed or
added record changes it too; unlike BLAKE2b it is not collision-resistant against someone
forging records on purpose (who can write the topic anyway), which is not what it guards
against."""

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


BLAKE2B = "blake2b"  # ContentHash: the built-in sinks' ledger rows
MD5SUM = "md5sum"  # RecordSum: a transform run's ledger rows
_MOD = 1 << (8 * DIGEST_BYTES)


class RecordSum:
    """The ``md5sum`` kind, as ``pipeline verify`` recomputes it from Messages (the same
    interface as ContentHash): the ledger rows of transform runs from before a transform's
    input was the built-in read, which Spark SQL hashed."""

    __slots__ = ("_sum", "records")

    def __init__(self) -> None:
        self._sum = 0
        self.records = 0

    def add(self, records: Iterable) -> None:
        md5, header, total, n = hashlib.md5, _HEADER, self._sum, 0
        for m in records:
            k, v = m.key(), m.value()
            total += int.from_bytes(md5(
                header(m.offset(), -1 if k is None else len(k), -1 if v is None else len(v))
                + (k or b"") + (v or b"")).digest(), "big")
            n += 1
        self._sum = total % _MOD
        self.records += n

    def digest(self) -> bytes:
        return from_sum(self._sum)


def from_sum(total: int) -> bytes:
    return (total % _MOD).to_bytes(DIGEST_BYTES, "big")


def hasher(kind: str):
    """The class that recomputes a ledger row's ``hash_kind``."""
    return {BLAKE2B: ContentHash, MD5SUM: RecordSum}[kind]
