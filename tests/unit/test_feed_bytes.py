"""A transform's read task bounds its batches by bytes as well as by records
(executor/transform/feed.ByteBound): big records come in slices the JVM can hold, and the next
consume() asks for as many as the bound holds; records of the usual size are never cut."""

from __future__ import annotations

import pyarrow as pa

from pipeline.executor.transform.feed import ByteBound


def values(n: int, size: int) -> pa.RecordBatch:
    return pa.RecordBatch.from_pydict({"offset": list(range(n)),
                                       "value": [bytes([i % 256]) * size for i in range(n)]})


def test_a_batch_of_big_records_reaches_the_jvm_in_slices_under_the_bound():
    bound = ByteBound(5_000, 1_000_000)
    batch = values(50, 150_000)  # 7.5 MB

    slices = list(bound.cut(batch))

    assert all(s.nbytes <= 1_000_000 for s in slices)
    assert pa.Table.from_batches(slices).equals(pa.Table.from_batches([batch]))
    assert bound() == 6  # the next consume() asks for what the bound holds


def test_records_of_the_usual_size_keep_their_batch_and_the_full_ask():
    bound = ByteBound(5_000, 16 * 2**20)
    batch = values(5_000, 300)

    assert list(bound.cut(batch)) == [batch]
    assert bound() == 5_000


def test_one_record_bigger_than_the_bound_is_a_batch_of_its_own():
    bound = ByteBound(5_000, 1_000)
    slices = list(bound.cut(values(3, 5_000)))
    assert [len(s) for s in slices] == [1, 1, 1] and bound() == 1


def test_records_too_big_for_row_bounded_batches_stop_the_job_before_the_jvm_sees_them():
    import pytest

    from pipeline.errors import Kind, TaskError
    from pipeline.executor.task import FeedTask
    from pipeline.executor.transform.feed import too_big
    from pipeline.plan.offsets import OffsetRange

    def spec(limit):
        return FeedTask(None, {}, 1.0, None, (), row_bytes_limit=limit)

    r = OffsetRange("t", 0, 0, 50)
    too_big(spec(None), r, values(50, 150_000))  # bounded by bytes already: goes on
    too_big(spec(6_710), r, values(50, 300))  # small records: goes on
    with pytest.raises(TaskError) as e:
        too_big(spec(6_710), r, values(50, 150_000))
    assert e.value.kind == Kind.RESIZE and e.value.message.startswith("t[0] [0, 50): records")
