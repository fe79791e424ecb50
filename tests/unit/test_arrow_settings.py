"""The SQL settings of a transform's job (spark/arrow_settings.py): Spark's batches bounded
by bytes at our cap, unless the user capped the bytes themselves."""

from __future__ import annotations

from pipeline.spark.arrow_settings import (
    BYTES_PER_BATCH,
    MAX_BYTES_PER_BATCH,
    MAX_RECORDS_PER_BATCH,
    UNCHECKED_BYTES,
    writer_sql_conf,
)


def test_a_transforms_job_bounds_its_batches_by_bytes_never_by_rows_alone():
    # BatchedPythonArrowInput: (maxBytesPerBatch == Int.MaxValue) || sizeInBytes() < max;
    # Int.MaxValue would leave 10,000 rows a batch whatever their size.
    assert writer_sql_conf({}) == {MAX_BYTES_PER_BATCH: BYTES_PER_BATCH}
    assert BYTES_PER_BATCH != UNCHECKED_BYTES
    assert int(BYTES_PER_BATCH) <= 256 * 2**20  # Spark's own default cap at most


def test_a_users_byte_cap_wins_and_a_row_cap_alone_keeps_ours():
    assert writer_sql_conf({MAX_BYTES_PER_BATCH: "64m"}) == {}
    assert writer_sql_conf({MAX_RECORDS_PER_BATCH: "1000"}) == {
        MAX_BYTES_PER_BATCH: BYTES_PER_BATCH}
