"""A transform run over records whose Kafka timestamp Spark cannot hold (issue 23): the read
tasks that feed the transform (executor/transform/feed.py) make them dead letters, counted in the
run's ledger like every record - on the real broker, Postgres and Spark."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from pipeline.driver.job import run_ingest
from tests.helpers import BOOTSTRAP, create_topic, make_settings, order, query, unique
from tests.integration._reliability import init_db
from tests.integration.test_verify_transform import kafka_sum, ledger

BEYOND = 9_300_000_000_000_000  # ms: past Spark's int64 microseconds
IDENTITY = "tests.integration.transforms.orders:identity"


def far_topic(partitions: int) -> str:
    return create_topic(unique("far"), partitions,
                        **{"message.timestamp.after.max.ms": str(2**63 - 1)})


def produce_at(topic: str, partition: int, timestamps: list[int | None], first_id: int = 0):
    """One order per timestamp (None: the producer's clock), in this offset order."""
    p = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True})
    for i, ts in enumerate(timestamps, first_id):
        p.produce(topic, key=b"k", value=order(i), partition=partition,
                  **({"timestamp": ts} if ts is not None else {}))
        p.flush(30)


@pytest.mark.slow
def test_far_records_anywhere_in_a_range_are_dead_letters_and_the_ledger_counts_them(spark):
    topic = far_topic(2)
    # Far at the range's start, twice in a row, and at its end; partition 1 has none.
    produce_at(topic, 0, [BEYOND, None, BEYOND, BEYOND + 1, None, BEYOND])
    produce_at(topic, 1, [None, None])
    s = init_db(make_settings(unique("far"), [topic], sink={"transform": IDENTITY}))
    first = run_ingest(s)
    assert first.status == "succeeded"
    table = s.sink.table
    assert query(f'SELECT "partition", "offset" FROM {table} ORDER BY 1, 2') == [
        (0, 1), (0, 4), (1, 0), (1, 1)]
    assert query('SELECT "partition", "offset", error_type, kafka_timestamp, value FROM '
                 'pipeline_dead_letters WHERE pipeline = %s ORDER BY 1, 2', (s.name,)) == [
        (0, o, "timestamp_out_of_range", None, order(o)) for o in (0, 2, 3, 5)]
    # A later run: the far records precede its range (still in the log), none in it.
    produce_at(topic, 0, [None, None], first_id=6)
    assert run_ingest(s).status == "succeeded"
    assert query(f'SELECT "offset" FROM {table} WHERE "partition" = 0 ORDER BY 1') == [
        (1,), (4,), (6,), (7,)]
    rows = ledger(s.name)
    assert [r[1:7] for r in rows] == [(0, 0, 6, 6, 2, 4), (0, 6, 8, 2, 2, 0),
                                      (1, 0, 2, 2, 2, 0)]
    for _, p, start, until, *_, digest in rows:  # far records hashed like every record
        assert bytes(digest) == kafka_sum(topic, p, start, until)
