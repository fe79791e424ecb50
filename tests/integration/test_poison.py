"""Poison records: no single record can stop a pipeline. Each record below used to fail every
run (exit 1, nothing committed, the next run the same) and must now be a result row or a
dead letter of a named type, exactly once, with the offsets at the end (issue 23). Through
the real CLI on the real broker and Postgres, on the built-in path (json and raw sinks) and
on the transform path (the same read and decode feeding a DataFrame, executor/transform/feed.py)."""

from __future__ import annotations

import pytest
from confluent_kafka import Producer

from tests.helpers import (
    BOOTSTRAP,
    TEST_DB_URL,
    cli_here,
    create_topic,
    init_cli,
    query,
    toml_config,
    unique,
)
from tests.integration._reliability import end_offsets, kafka_records, stored

DEEP = 3000  # json.loads: RecursionError (not a ValueError); orjson and Jackson refuse it
FAR = 1_700_000_000_000_000  # ms: microseconds sent as milliseconds, year 55840


def order(i: int) -> bytes:
    return f'{{"order_id": {i}, "customer": "c{i}", "amount": 1.5}}'.encode()


# offset -> (value, timestamp ms or None for the producer's clock, json sink outcome)
POISON = [
    (order(0), None, "row"),
    (b'{"order_id": 1, "customer": "c1", "extra": ' + b"[" * DEEP + b"]" * DEEP + b"}", None,
     "malformed_json"),  # a valid object; its unknown field nested 3,000 arrays deep
    (order(2), None, "row"),
    (b"[" * DEEP + b"]" * DEEP, None, "malformed_json"),  # a bare array 3,000 deep
    (order(4), None, "row"),
    (order(5), FAR, "row"),  # a good record whose Kafka timestamp is past year 9999
    (order(6), None, "row"),
]


def run_once(name: str, topic: str, tmp_path, fmt: str, transform: str | None) -> None:
    """Pipeline ``name`` of sink format ``fmt`` (and ``transform``) made with init-db and
    run once through the CLI; it must exit 0."""
    config = tmp_path / "c.toml"
    config.write_text(toml_config(name, [topic], fmt=fmt, extra_sink=(
        f'transform = "{transform}"' if transform else "")))
    init_cli(config)

    r = cli_here("run", "--config", str(config))

    assert r.returncode == 0, r.stderr[-3000:]


@pytest.fixture(scope="module")
def poison_topic(stack):
    """One partition, offsets in POISON's order. The broker accepts a timestamp this far
    ahead only when the topic allows it (Kafka 4's default allows one hour)."""
    topic = create_topic(unique("poison"), 1,
                         **{"message.timestamp.after.max.ms": str(2**63 - 1)})
    p = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True})
    for i, (value, ts, _) in enumerate(POISON):
        p.produce(topic, key=f"k{i}".encode(), value=value, partition=0,
                  **({"timestamp": ts} if ts is not None else {}))
        p.flush(30)  # one at a time: offsets in POISON's order
    assert p.flush(30) == 0
    assert end_offsets(topic, BOOTSTRAP) == {0: len(POISON)}
    assert kafka_records(topic, BOOTSTRAP)[(0, 5)][3] == FAR  # the broker kept it
    return topic


@pytest.mark.parametrize("fmt, transform", [
    ("json", None), ("raw", None), ("json", "tests.integration.transforms.orders:identity"),
    ("raw", "tests.integration.transforms.orders:identity"),
], ids=["json", "raw", "json-transform", "raw-transform"])
def test_poison_records_become_rows_or_dead_letters_and_the_run_goes_on(poison_topic,
                                                                        tmp_path, fmt,
                                                                        transform):
    name = unique(f"poison_{fmt}")
    run_once(name, poison_topic, tmp_path, fmt, transform)
    expected = {o: "row" if fmt == "raw" else outcome
                for o, (_, _, outcome) in enumerate(POISON)}
    rows = query(f'SELECT "offset" FROM {name}')
    dead = query('SELECT "offset", error_type, error_message, value FROM '
                 "pipeline_dead_letters WHERE pipeline = %s", (name,))
    placed = [(o, "row") for (o,) in rows] + [(o, t) for o, t, _, _ in dead]
    assert sorted(placed) == sorted(expected.items())  # each record once, as expected
    for offset, _, message, value in dead:
        assert value == POISON[offset][0] and "deeper" in message, (offset, message)
    # The far timestamp is stored as Kafka has it (read as epoch ms: psycopg, like Python's
    # datetime, cannot hold a year past 9999).
    timestamps = dict(query(
        f'SELECT "offset", (extract(epoch FROM kafka_timestamp) * 1000)::bigint FROM {name}'))
    assert timestamps[5] == FAR
    assert stored(name, TEST_DB_URL) == {0: len(POISON)}  # the offsets at the end
    assert query("SELECT count(*) FROM pipeline_runs WHERE pipeline = %s AND status = "
                 "'succeeded'", (name,)) == [(1,)]



BEYOND = 9_300_000_000_000_000  # ms: past Postgres's year 294276 and Spark's int64 micros


@pytest.fixture(scope="module")
def beyond_topic(stack):
    """A good record whose Kafka timestamp no Postgres timestamptz holds, between two
    ordinary ones (a producer that sent nanoseconds / 1000 as milliseconds)."""
    topic = create_topic(unique("beyond"), 1,
                         **{"message.timestamp.after.max.ms": str(2**63 - 1)})
    p = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True})
    for i, ts in enumerate([None, BEYOND, None]):
        p.produce(topic, key=f"k{i}".encode(), value=order(i), partition=0,
                  **({"timestamp": ts} if ts is not None else {}))
        p.flush(30)
    assert kafka_records(topic, BOOTSTRAP)[(0, 1)][3] == BEYOND  # the broker kept it
    return topic


@pytest.mark.parametrize("fmt, transform", [
    ("json", None), ("raw", None),
    # The transform's input is the built-in read and decode (executor/transform/feed.py): the
    # same dead letter as the built-in path's.
    ("json", "tests.integration.transforms.orders:identity"),
    ("raw", "tests.integration.transforms.orders:identity"),
], ids=["json", "raw", "json-transform", "raw-transform"])
def test_a_timestamp_postgres_cannot_hold_is_a_dead_letter_and_the_run_goes_on(
        beyond_topic, tmp_path, fmt, transform):
    name = unique(f"beyond_{fmt}")
    run_once(name, beyond_topic, tmp_path, fmt, transform)
    assert query(f'SELECT "offset" FROM {name} ORDER BY 1') == [(0,), (2,)]
    [(offset, error_type, message, timestamp)] = query(
        'SELECT "offset", error_type, error_message, kafka_timestamp FROM '
        "pipeline_dead_letters WHERE pipeline = %s", (name,))
    assert (offset, error_type, timestamp) == (1, "timestamp_out_of_range", None)
    assert f"Kafka timestamp {BEYOND} ms is outside what Postgres can store" in message
    assert stored(name, TEST_DB_URL) == {0: 3}
