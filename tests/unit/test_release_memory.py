"""A reused Python worker gives its task's freed memory back at the end of each read and
write task (executor/release.py): the workers of a transform run take turns reading and
writing, and what one task freed stayed in the C heap for the next (docs/benchmarks.md,
"round four")."""

from __future__ import annotations

import ctypes
import gc
import weakref
from collections import Counter

import pyarrow as pa

from pipeline.executor import feed, release, stage, zip_imports
from pipeline.executor.task import EncoderSettings, FeedTask, LineStageTask, StagingTarget

TARGET = StagingTarget("postgresql://db/x", "COPY s FROM STDIN (FORMAT BINARY)", ["int4"])


class _Cycle:
    pass


def _garbage():
    """A reference cycle that only the collector frees, and a weak reference to it."""
    a, b = _Cycle(), _Cycle()
    a.other, b.other = b, a
    return weakref.ref(a)


def test_it_collects_and_trims_the_c_heap_where_the_c_library_can():
    ref = _garbage()
    gc.disable()
    try:
        assert release.release_memory() is True  # glibc, as on every supported Linux
        assert ref() is None
    finally:
        gc.enable()


def test_a_c_library_without_malloc_trim_still_collects(monkeypatch):
    class NoTrim:  # musl, macOS
        def __init__(self, name):
            pass

    monkeypatch.setattr(ctypes, "CDLL", NoTrim)
    ref = _garbage()
    gc.disable()
    try:
        assert release.release_memory() is False
        assert ref() is None
    finally:
        gc.enable()


def _counting(monkeypatch) -> list:
    # The tasks' other set-up patches this process's zipimport for good: not here.
    monkeypatch.setattr(zip_imports, "install", lambda: None)
    calls = []
    monkeypatch.setattr(release, "release_memory", lambda: calls.append(1) or True)
    return calls


def test_a_read_task_releases_its_memory_when_it_ends(monkeypatch):
    calls = _counting(monkeypatch)
    monkeypatch.setattr(feed, "_read_task", lambda spec, index: iter([f"batch {index}"]))
    spec = FeedTask(TARGET, {}, 30.0, EncoderSettings("json", (), 7), ((), ()))
    out = feed.feeder(spec)(iter([pa.RecordBatch.from_pydict({"id": [0, 1]})]))
    assert next(out) == "batch 0" and next(out) == "batch 1"
    assert calls == []  # not while the task still yields
    assert list(out) == [] and calls == [1]


def test_a_write_task_releases_its_memory_when_it_has_staged(monkeypatch):
    calls = _counting(monkeypatch)

    def staged(target, batches):
        assert calls == []  # not before its blobs are staged
        for _ in batches:
            pass
        return 3, 0, Counter({stage.ROW: 0})

    monkeypatch.setattr(stage, "stage_attempt", staged)
    out = list(stage.blob_writer(LineStageTask(TARGET, ()))(iter(())))
    assert out[0].to_pydict() == {"part": [3], "attempt": [0], "rows": [0]}
    assert calls == [1]
