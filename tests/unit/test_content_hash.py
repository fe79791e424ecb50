"""The content hash of a range's records: the same records hash the same however they are
batched; any change to an offset, key or value (a null, too) changes it."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.executor.content_hash import DIGEST_BYTES, ContentHash


@dataclass(frozen=True)
class Record:
    """What the hash reads of a confluent_kafka Message."""

    o: int
    k: bytes | None
    v: bytes | None

    def offset(self) -> int:
        return self.o

    def key(self) -> bytes | None:
        return self.k

    def value(self) -> bytes | None:
        return self.v


def digest(*batches) -> bytes:
    h = ContentHash()
    for batch in batches:
        h.add(batch)
    return h.digest()


RECORDS = [Record(0, b"a", b"1"), Record(1, None, b"22"), Record(3, b"c", None)]


def test_the_same_records_hash_the_same_however_they_are_batched():
    assert digest(RECORDS) == digest(RECORDS[:1], RECORDS[1:]) == digest(RECORDS[:2], [],
                                                                          RECORDS[2:])
    assert len(digest(RECORDS)) == DIGEST_BYTES


def test_it_counts_the_records():
    h = ContentHash()
    h.add(RECORDS[:2])
    h.add(RECORDS[2:])
    assert h.records == 3


def test_a_changed_offset_key_or_value_changes_the_hash():
    base = digest(RECORDS)
    for changed in (Record(2, b"c", None), Record(3, b"d", None), Record(3, b"c", b""),
                    Record(3, None, None), Record(3, b"", None)):
        assert digest([*RECORDS[:2], changed]) != base, changed


def test_bytes_moved_between_key_and_value_change_the_hash():
    assert digest([Record(0, b"ab", b"c")]) != digest([Record(0, b"a", b"bc")])


def test_a_record_missing_or_added_changes_the_hash():
    assert digest(RECORDS[:2]) != digest(RECORDS)
    assert digest([*RECORDS, Record(4, b"e", b"5")]) != digest(RECORDS)
