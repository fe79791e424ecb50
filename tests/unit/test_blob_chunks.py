"""A staged blob is bounded by bytes as well as records: a bytea value (and a COPY row)
cannot pass 1 GB, and a batch of large records would."""

from __future__ import annotations

import pyarrow as pa

from pipeline.executor.blobs import arrow_chunks, blob_spans, line_chunks
from pipeline.executor.task import BLOB_BYTES


def test_lines_are_split_into_blobs_of_at_most_the_byte_cap():
    lines = ["aaaa\n", "bbbb\n", "cccc\n", "dddd\n", "eeee\n"]  # 5 bytes each

    blobs = list(line_chunks(lines, max_bytes=10))

    assert blobs == [lines[0:2], lines[2:4], lines[4:5]]
    assert all(len("".join(b).encode()) <= 10 for b in blobs)


def test_every_line_is_in_exactly_one_blob_in_order():
    lines = [f"{i}\t{'x' * (i % 7)}\n" for i in range(100)]

    blobs = list(line_chunks(lines, max_bytes=23))

    assert [line for blob in blobs for line in blob] == lines
    assert all(len("".join(b).encode()) <= 23 for b in blobs)


def test_a_line_larger_than_the_cap_is_a_blob_of_its_own():
    lines = ["a\n", "b" * 50 + "\n", "c\n"]

    assert list(line_chunks(lines, max_bytes=10)) == [["a\n"], ["b" * 50 + "\n"], ["c\n"]]


def test_the_cap_counts_utf8_bytes_not_characters():
    lines = ["é" * 4 + "\n"] * 3  # 5 characters, 9 bytes each

    assert list(line_chunks(lines, max_bytes=18)) == [lines[0:2], lines[2:3]]


def test_binary_rows_are_counted_in_bytes():
    lines = [b"\x00" * 6] * 4

    assert list(line_chunks(lines, max_bytes=12)) == [lines[0:2], lines[2:4]]


def test_no_lines_make_no_blob():
    assert list(line_chunks([], max_bytes=10)) == []
    assert list(arrow_chunks(pa.array([], pa.string()), 10, pa)) == []


def test_one_batch_of_small_lines_stays_one_blob_under_the_default_cap():
    lines = ["x" * 100 + "\n"] * 10_000

    assert [len(b) for b in line_chunks(lines)] == [10_000]
    assert BLOB_BYTES < 1 << 30  # Postgres's limit for one bytea value


def test_an_arrow_array_is_split_on_its_offsets_including_a_sliced_one():
    values = [f"{i}:{'y' * (i % 5)}\n" for i in range(40)]
    whole = pa.array(["skipped\n"] * 3 + values, pa.string())
    lines = whole.slice(3)  # a non-zero array offset, as after drop_null on a batch slice

    blobs = list(arrow_chunks(lines, 20, pa))

    assert [s for b in blobs for s in b.to_pylist()] == values
    assert all(sum(len(s.encode()) for s in b.to_pylist()) <= 20 for b in blobs)
    assert len(blobs) > 1


def test_spans_from_cumulative_ends():
    assert blob_spans([3, 6, 9, 30, 33], max_bytes=6) == [(0, 2), (2, 3), (3, 4), (4, 5)]
    assert blob_spans([], max_bytes=6) == []
