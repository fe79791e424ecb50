"""The staging table's contract (pipeline/executor/staging.py): what the executors write
(stage.attempt_writer) is what the store's table holds (store/tables.staging) and what the
driver reads, column for column."""

from __future__ import annotations

from pipeline.executor import stage, staging
from pipeline.executor.staging import COLUMNS, ROW, Blob
from pipeline.store import tables
from tests.unit.test_stage_task import TARGET, FakeConnection


def test_the_staging_tables_columns_are_the_contracts_in_order():
    assert tuple(c.name for c in tables.staging("_stage_x_r1").columns) == COLUMNS


def test_an_attempt_writes_its_tags_and_seq_then_a_blob_one_value_per_column(monkeypatch):
    log: list = []
    monkeypatch.setattr(stage, "executor_connection", lambda url: FakeConnection(log))
    with stage.attempt_writer(TARGET, 3, 1, 41) as put:
        put(Blob("orders", 2, ROW, 5, 10, 14, b"rows"))
    (row,) = [entry[1] for entry in log if entry[0] == "row"]
    assert dict(zip(COLUMNS, row, strict=True)) == {
        "part": 3, "attempt": 1, "task": 41, "seq": 0, "topic": "orders", "partition": 2,
        "kind": ROW, "n": 5, "min_offset": 10, "max_offset": 14, "blob": b"rows"}


def test_blob_kinds_are_distinct_and_reader_parts_never_a_writers():
    kinds = [staging.ROW, staging.DEAD, staging.TOMBSTONE, staging.HASH, staging.RECEIVED]
    assert len(set(kinds)) == len(kinds)
    parts = [staging.reader_part(i) for i in range(1000)]
    assert len(set(parts)) == len(parts) and max(parts) < 0  # a writer's part is >= 0
