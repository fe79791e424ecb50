"""The SQL settings of a transform's job (spark/arrow_settings.py): Spark's per-row batch
size check off unless the user capped the bytes themselves; then its read tasks refuse
records too big for row-bounded batches, and the job runs again bounded by bytes."""

from __future__ import annotations

from pipeline.spark.arrow_settings import (
    BYTES_PER_BATCH,
    MAX_BYTES_PER_BATCH,
    MAX_RECORDS_PER_BATCH,
    UNCHECKED_BYTES,
    bounded_sql_conf,
    row_bytes_limit,
    writer_sql_conf,
)


def test_spark_skips_its_per_row_size_check_only_for_int_max():
    # BatchedPythonArrowInput: (maxBytesPerBatch == Int.MaxValue) || sizeInBytes() < max
    assert UNCHECKED_BYTES == str(2_147_483_647)
    assert writer_sql_conf({}) == {MAX_BYTES_PER_BATCH: UNCHECKED_BYTES}


def test_a_users_byte_cap_wins_and_a_row_cap_alone_keeps_ours():
    assert writer_sql_conf({MAX_BYTES_PER_BATCH: "64m"}) == {}
    assert writer_sql_conf({MAX_RECORDS_PER_BATCH: "1000"}) == {
        MAX_BYTES_PER_BATCH: UNCHECKED_BYTES}


def test_row_bounded_batches_hold_rows_up_to_our_byte_cap_and_bounded_ones_any():
    fast = writer_sql_conf({})
    assert row_bytes_limit({}, fast) == int(BYTES_PER_BATCH) // 10_000
    assert row_bytes_limit({MAX_RECORDS_PER_BATCH: "1000"}, fast) == \
        int(BYTES_PER_BATCH) // 1000
    assert bounded_sql_conf({}) == {MAX_BYTES_PER_BATCH: BYTES_PER_BATCH}
    assert row_bytes_limit({}, bounded_sql_conf({})) is None
    mine = {MAX_BYTES_PER_BATCH: "1048576"}  # the user's cap: Spark checks every row
    assert bounded_sql_conf(mine) == {} and row_bytes_limit(mine, writer_sql_conf(mine)) is None
