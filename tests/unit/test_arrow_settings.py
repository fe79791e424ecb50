"""The SQL settings of a transform's job (spark/arrow_settings.py): Spark's per-row batch
size check off unless the user capped the bytes themselves."""

from __future__ import annotations

from pipeline.spark.arrow_settings import (
    MAX_BYTES_PER_BATCH,
    MAX_RECORDS_PER_BATCH,
    UNCHECKED_BYTES,
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
