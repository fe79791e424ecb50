"""A task's lines -> blobs of at most a number of bytes each, with no per-line Python where
the lines are an Arrow array (a line larger than the limit is a blob of its own)."""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Iterator, Sequence
from itertools import accumulate

from pipeline.executor.task import BLOB_BYTES


def blob_spans(ends: Sequence[int], max_bytes: int, start: int = 0) -> list[tuple[int, int]]:
    """Lines [i, j) of each blob, in order, each blob at most ``max_bytes`` (a line larger
    than that alone is a blob of its own). ``ends[k]``: where line k ends in the lines laid
    end to end, which begin at ``start`` (cumulative sizes, or an Arrow offsets buffer)."""
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(ends):
        j = max(bisect_right(ends, start + max_bytes, i), i + 1)
        spans.append((i, j))
        start, i = ends[j - 1], j
    return spans


def line_chunks(lines: Sequence[str | bytes], max_bytes: int = BLOB_BYTES) -> Iterator[Sequence]:
    """Python lines (str or bytes) -> consecutive slices of at most ``max_bytes`` of UTF-8;
    nothing for no lines."""
    if sum(map(len, lines)) * 4 <= max_bytes:  # UTF-8 takes at most 4 bytes a character:
        if lines:                              # one blob, without measuring each line
            yield lines
        return
    ends = list(accumulate(len(x) if isinstance(x, bytes) or x.isascii() else
                           len(x.encode()) for x in lines))
    for i, j in blob_spans(ends, max_bytes):
        yield lines[i:j]


def arrow_chunks(lines, max_bytes: int, pa) -> Iterator:
    """A string array -> consecutive slices of at most ``max_bytes`` of data, from its
    offsets buffer (no per-line Python); nothing for an empty array."""
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    if not len(lines):
        return
    offsets = memoryview(lines.buffers()[1]).cast("q" if lines.type == pa.large_string()
                                                     else "i")
    first = lines.offset
    for i, j in blob_spans(offsets[first + 1:first + len(lines) + 1], max_bytes,
                           offsets[first]):
        yield lines.slice(i, j - i)


def contiguous(lines, pa) -> bytes:
    """The lines of a string array as one buffer: its data buffer between the first and
    the last offset, copied once (no per-line Python)."""
    if isinstance(lines, pa.ChunkedArray):
        lines = lines.combine_chunks()
    if lines.type == pa.large_string():
        width = "q"
    else:
        width = "i"
    _, offsets_buf, data_buf = lines.buffers()
    offsets = memoryview(offsets_buf).cast(width)
    start, end = offsets[lines.offset], offsets[lines.offset + len(lines)]
    return bytes(memoryview(data_buf)[start:end])
