"""A transform's output rows (typed Arrow, as mapInArrow hands them to the writer) as COPY
text lines (executor/transform/arrow_copy.py): what Postgres reads back exactly; no Spark."""

from datetime import UTC, date, datetime
from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc

from pipeline.executor.transform import arrow_copy

COLUMNS = [("topic", "text"), ("partition", "integer"), ("offset", "bigint"),
           ("kafka_timestamp", "timestamp with time zone"), ("name", "text"),
           ("amount", "numeric(12,2)"), ("x", "double precision"), ("ok", "boolean"),
           ("d", "date"), ("k", "bytea")]


def lines(batch, columns=COLUMNS):
    return arrow_copy.lines(batch, columns, 7, pa, pc).to_pylist()


def test_every_staged_type_as_copy_text_nulls_as_backslash_n():
    batch = pa.RecordBatch.from_pydict({
        "topic": ["t", "t"], "partition": pa.array([0, 1], pa.int32()),
        "offset": pa.array([5, 6], pa.int64()),
        "kafka_timestamp": pa.array([datetime(2023, 11, 14, 22, 13, 20, 123456, tzinfo=UTC),
                                     None], pa.timestamp("us", tz="UTC")),
        "name": ["a\\b\tc\nd\re", None],
        "amount": pa.array([Decimal("1.50"), None], pa.decimal128(12, 2)),
        "x": [float("nan"), 1e300], "ok": [True, None],
        "d": pa.array([date(2024, 1, 2), None]), "k": pa.array([b"\x00\xff", None])})
    assert lines(batch) == [
        "t\t0\t5\t2023-11-14 22:13:20.123456+00\ta\\\\b\\tc\\nd\\re\t1.50\tnan\ttrue\t"
        "2024-01-02\t\\\\x00ff\t7\n",
        "t\t1\t6\t\\N\t\\N\t\\N\t1e+300\t\\N\t\\N\t\\N\t7\n"]


def test_timestamps_of_years_1_to_9999_keep_four_digit_years_and_six_fraction_digits():
    batch = pa.RecordBatch.from_pydict({"ts": pa.array(
        [datetime(5, 1, 2, 3, 4, 5, tzinfo=UTC), datetime(9999, 12, 31, 23, 59, 59, 999999,
                                                          tzinfo=UTC),
         datetime(1969, 12, 31, 23, 59, 59, 1, tzinfo=UTC)], pa.timestamp("us", tz="UTC"))})
    assert lines(batch, [("ts", "timestamptz")]) == [
        "0005-01-02 03:04:05.000000+00\t7\n", "9999-12-31 23:59:59.999999+00\t7\n",
        "1969-12-31 23:59:59.000001+00\t7\n"]


def test_timestamps_past_year_9999_and_bc_as_postgres_reads_them():
    # The instants as Postgres 15 prints them (to_timestamp(1761000000000) + 123 us).
    batch = pa.RecordBatch.from_pydict({"ts": pa.array(
        [1_761_000_000_000_000_000 + 123, -62_135_596_800_000_000 - 86_400_000_000, None],
        pa.timestamp("us", tz="UTC"))})
    assert lines(batch, [("ts", "timestamptz")]) == [
        "57773-11-13 10:40:00.000123+00\t7\n", "0001-12-31 00:00:00.000000+00 BC\t7\n",
        "\\N\t7\n"]


def test_a_fixed_topic_gives_the_lines_of_the_column_it_replaces():
    # A run of one topic: the writer's rows come without the column (spark/topic_literal.py).
    batch = pa.RecordBatch.from_pydict({
        "topic": ["orders.eu-1", "orders.eu-1"], "partition": pa.array([0, 3], pa.int32()),
        "offset": pa.array([5, 6], pa.int64()), "name": ["a\tb", None]})
    columns = [("topic", "text"), ("partition", "integer"), ("offset", "bigint"),
               ("name", "text")]
    fixed = arrow_copy.lines(batch.drop_columns(["topic"]), columns, 7, pa, pc,
                             {"topic": "orders.eu-1"})
    assert fixed.to_pylist() == lines(batch, columns) == [
        "orders.eu-1\t0\t5\ta\\tb\t7\n", "orders.eu-1\t3\t6\t\\N\t7\n"]
    # Escaped as the column's text would be (Kafka's names never need it).
    assert arrow_copy.lines(batch.drop_columns(["topic"]), columns, 7, pa, pc,
                            {"topic": "a\\b"}).to_pylist()[0] == "a\\\\b\t0\t5\ta\\tb\t7\n"
