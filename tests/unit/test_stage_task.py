"""The executor's task spec (frozen, typed, picklable) and the one staging skeleton every
task runs: one COPY, blobs numbered in order, one commit, counts per kind."""

from __future__ import annotations

import dataclasses
import pickle
from contextlib import contextmanager

import pytest

from pipeline.executor import stage
from pipeline.executor.stage import stage_attempt
from pipeline.executor.staging import DEAD, ROW, TOMBSTONE, Blob
from pipeline.executor.task import (
    BLOB_BYTES,
    EncoderSettings,
    FeedTask,
    LineStageTask,
    RangeStageTask,
    StagingTarget,
)
from pipeline.plan.offsets import OffsetRange

TARGET = StagingTarget("postgresql://db/x", "COPY s FROM STDIN (FORMAT BINARY)",
                       ["int4", "bytea"])


def test_a_spec_is_frozen_typed_and_pickles_to_an_equal_spec():
    spec = RangeStageTask(TARGET, {"bootstrap.servers": "k:9092"}, 30.0, [
        ("orders", EncoderSettings("json", [["id", "bigint", True]], 7, ["id"])),
        ("lines", EncoderSettings("json", [["line", "bigint", True]], 7))])
    assert spec.target.types == ("int4", "bytea") and spec.target.max_blob_bytes == BLOB_BYTES
    # Each topic's records are encoded by its own route's settings.
    assert spec.encoding("orders").columns == (("id", "bigint", True),)
    assert spec.encoding("orders").tombstone_key == ("id",)
    assert spec.encoding("lines").columns == (("line", "bigint", True),)
    assert spec.encoding("lines").tombstone_key == ()
    with pytest.raises(KeyError, match="other"):
        spec.encoding("other")
    assert pickle.loads(pickle.dumps(spec)) == spec
    with pytest.raises(dataclasses.FrozenInstanceError):
        spec.timeout_seconds = 1  # type: ignore[misc]
    lines = LineStageTask(TARGET, [OffsetRange("t", 0, 5, 9)])
    assert lines.ranges == (OffsetRange("t", 0, 5, 9),)
    assert pickle.loads(pickle.dumps(lines)) == lines
    feed = FeedTask(TARGET, {}, 30.0, EncoderSettings("raw", (), 7),
                    [[OffsetRange("t", 0, 0, 5)], [OffsetRange("t", 1, 0, 5)]])
    assert feed.tasks[1] == (OffsetRange("t", 1, 0, 5),)
    assert pickle.loads(pickle.dumps(feed)) == feed


def test_encoder_settings_build_the_encoder_they_describe():
    encoder = EncoderSettings("raw", (), 9).encoder()
    assert encoder.binary and encoder.run_id == 9 and encoder.key == []


class FakeCopy:
    def __init__(self, log):
        self.log = log

    def set_types(self, types):
        self.log.append(("types", tuple(types)))

    def write_row(self, row):
        self.log.append(("row", row))


class FakeConnection:
    def __init__(self, log):
        self.log = log

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.log.append(("close", exc[0] is None))

    @contextmanager
    def cursor(self):
        yield self

    @contextmanager
    def copy(self, sql):
        self.log.append(("copy", sql))
        yield FakeCopy(self.log)

    def commit(self):
        self.log.append(("commit",))


class FakeContext:
    def partitionId(self):
        return 3

    def attemptNumber(self):
        return 1

    def taskAttemptId(self):
        return 41


@pytest.fixture
def staged(monkeypatch):
    import pyspark

    log: list = []
    monkeypatch.setattr(stage, "executor_connection", lambda url: FakeConnection(log))
    monkeypatch.setattr(pyspark.TaskContext, "get", staticmethod(lambda: FakeContext()))
    return log


def test_one_copy_numbered_blobs_tagged_with_the_attempt_and_one_commit(staged):
    batches = [[Blob("t", 0, ROW, 2, 0, 1, b"a\nb\n"), Blob("t", 0, DEAD, 1, 0, 1, b"x\n")],
               [],
               [Blob("t", 1, TOMBSTONE, 4, 5, 9, b"k\n")]]
    part, attempt, totals = stage_attempt(TARGET, iter(batches))
    assert (part, attempt, totals) == (3, 1, {ROW: 2, DEAD: 1, TOMBSTONE: 4})
    assert staged == [
        ("copy", TARGET.copy_sql), ("types", ("int4", "bytea")),
        ("row", (3, 1, 41, 0, "t", 0, ROW, 2, 0, 1, b"a\nb\n")),
        ("row", (3, 1, 41, 1, "t", 0, DEAD, 1, 0, 1, b"x\n")),
        ("row", (3, 1, 41, 2, "t", 1, TOMBSTONE, 4, 5, 9, b"k\n")),
        ("commit",), ("close", True)]


def test_a_failing_batch_commits_nothing(staged):
    def batches():
        yield [Blob("t", 0, ROW, 1, 0, 0, b"a\n")]
        raise RuntimeError("the read broke")

    with pytest.raises(RuntimeError, match="the read broke"):
        stage_attempt(TARGET, batches())
    assert ("commit",) not in staged and staged[-1] == ("close", False)


def test_a_writers_spec_built_from_the_sinks_tables_pickles_without_sqlalchemy():
    """The driver takes the staged columns from SQLAlchemy's tables, whose names are its
    quoted_name: pickled as such, every writer worker imported SQLAlchemy to unpickle its
    spec (~11 MB and ~0.1 CPU-s a worker; git history of docs/benchmarks.md)."""
    import tomllib
    from pathlib import Path

    from pipeline.config import parse_settings
    from pipeline.store import tables

    example = Path(__file__).resolve().parents[2] / "conf" / "examples" / "transform.toml"
    sink = parse_settings(tomllib.loads(example.read_text()), environ={}).sink
    columns = tables.typed(tables.from_record(tables.record_rows(sink)))
    assert any(type(name) is not str for name, _ in columns)  # what the driver hands over
    spec = LineStageTask(TARGET, [OffsetRange("t", 0, 5, 9)], tuple(columns), 7, "t", True)
    assert b"sqlalchemy" not in pickle.dumps(spec)
    assert spec.columns == tuple((str(n), str(t)) for n, t in columns)
    assert all(type(n) is str and type(t) is str for n, t in spec.columns)
