"""A transform run of one topic keeps its ``topic`` column out of the JVM
(spark/topic_literal.py): the read tasks leave it out, the transform gets it as a literal,
and the writer writes it itself where Spark's optimizer proves every row still holds it.
None of this may change a row, a dead letter or the ledger: each run here is held to the
built-in path's run over the same records, column for column."""

from __future__ import annotations

import pytest

from pipeline.driver.job import run_ingest
from pipeline.spark import topic_literal
from tests.helpers import create_topic, init_db, make_settings, order, produce, query, unique

IDENTITY = "tests.integration.transforms.orders:identity"


def example_transform():
    """conf/examples/transforms/order_enrichment.py (its folder is not a package)."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "conf/examples/transforms/order_enrichment.py"
    spec = importlib.util.spec_from_file_location("order_enrichment", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def proofs(monkeypatch) -> list[bool]:
    """What proven_literal answered in each run (the writer left the column out or not)."""
    answers: list[bool] = []
    real = topic_literal.proven_literal

    def spy(df, topic):
        answers.append(real(df, topic))
        return answers[-1]

    monkeypatch.setattr(topic_literal, "proven_literal", spy)
    return answers


def records(i: int) -> list[tuple[bytes | None, bytes | None]]:
    """Orders with a few dead letters among them (malformed, wrong type, a null value)."""
    out = [(f"k{j}".encode(), order(j, placed_at="2026-03-08T06:30:00Z")) for j in range(i)]
    out[3] = (b"k3", b"{not json")
    out[5] = (b"k5", b'{"order_id": "five", "customer": "c5"}')
    out[7] = (b"k7", None)
    return out


def outcome(s) -> tuple[list, list, list]:
    """The run's rows (every column but run_id and ingested_at), dead letters and ledger
    rows, in order."""
    rows = query(f"SELECT to_jsonb(t) - 'run_id' - 'ingested_at' FROM {s.sink.table} t "
                 'ORDER BY topic, "partition", "offset"')
    dead = query('SELECT topic, "partition", "offset", key, value, error_type, error_message '
                 "FROM pipeline_dead_letters WHERE pipeline = %s ORDER BY 1, 2, 3", (s.name,))
    ledger = query('SELECT topic, "partition", from_offset, until_offset, records, '
                   "rows_written, dead_letters, filtered, skipped, hash_kind, content_hash "
                   "FROM pipeline_ranges WHERE pipeline = %s ORDER BY 1, 2, 3", (s.name,))
    return rows, dead, ledger


def both_paths(topics: list[str], transform: str, fmt: str = "json"):
    """The same topics read by the built-in path and by ``transform``: their outcomes."""
    builtin = init_db(make_settings(unique("lit_b"), topics, fmt=fmt))
    transformed = init_db(make_settings(unique("lit_t"), topics, fmt=fmt,
                                        sink={"transform": transform}))
    assert run_ingest(builtin).status == "succeeded"
    assert run_ingest(transformed).status == "succeeded"
    return outcome(builtin), outcome(transformed)


@pytest.mark.parametrize("fmt", ["json", "raw"])
def test_one_topic_leaves_the_column_out_and_changes_no_row_or_ledger_row(spark, proofs, fmt):
    topic = create_topic(unique("lit_one"), 2)
    produce(topic, records(30), partition=0)
    produce(topic, records(12), partition=1)

    (rows, dead, ledger), got = both_paths([topic], IDENTITY, fmt)

    assert proofs == [True]  # the writer wrote the topic itself
    assert got == (rows, dead, ledger)
    assert len(rows) == (36 if fmt == "json" else 42) and len(dead) == (6 if fmt == "json" else 0)
    assert {r[0]["topic"] for r in rows} == {topic}
    assert len(ledger) == 2 and all(r[0] == topic for r in ledger)


def test_two_topics_keep_the_column_and_each_row_its_own_topic(spark, proofs):
    first, second = create_topic(unique("lit_a"), 1), create_topic(unique("lit_z"), 1)
    produce(first, records(10))
    produce(second, records(14))

    (rows, dead, ledger), got = both_paths([first, second], IDENTITY)

    assert proofs == []  # no literal to prove: the rows carry their topics
    assert got == (rows, dead, ledger)
    assert sorted({r[0]["topic"] for r in rows}) == sorted([first, second])
    assert [(r[0], r[4]) for r in ledger] == sorted([(first, 10), (second, 14)])


def test_the_optimizer_proves_the_literal_only_where_every_row_holds_it(spark):
    import pyarrow as pa
    from pyspark.sql import functions as F

    enrich = example_transform().enrich

    def rows(batches):
        for _ in batches:
            yield pa.RecordBatch.from_pydict(
                {"partition": [0], "offset": [1], "customer": ["c1"], "amount": [2.5],
                 "region": [None], "segment": [None]},
                schema=pa.schema([("partition", pa.int32()), ("offset", pa.int64()),
                                  ("customer", pa.string()), ("amount", pa.float64()),
                                  ("region", pa.string()), ("segment", pa.string())]))

    read = spark.range(0, 1, 1, 1).mapInArrow(
        rows, "partition int, offset bigint, customer string, amount double, "
              "region string, segment string")
    records = topic_literal.with_topic(read, "orders")
    assert records.columns[0] == "topic"

    def proven(df) -> bool:
        return topic_literal.proven_literal(
            df.select("topic", "partition", "offset", "amount"), "orders")

    assert proven(records)
    assert proven(enrich(records))  # a filter and a left join keep it
    assert proven(records.where(F.col("topic") == "orders"))
    assert proven(records.groupBy("topic", "partition", "offset").agg(
        F.max("amount").alias("amount")))
    assert not proven(records.withColumn("topic", F.upper("topic")))
    assert not proven(records.withColumn("topic", F.lit(7)))
    assert not proven(records.unionByName(records.withColumn("topic", F.lit("other"))))
    assert not proven(records.unionByName(records))  # a Union on top, not a Project
    assert not proven(read.select(F.col("customer").alias("topic"), "partition", "offset",
                                  "amount"))
    assert not topic_literal.proven_literal(
        records.select("topic", "partition", "offset", "amount"), "other")
