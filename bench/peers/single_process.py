"""One Python process: confluent-kafka consume(num_messages=...), orjson, one binary COPY,
and the offsets in the same transaction: the strongest single-machine reference."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from decimal import Decimal

import orjson
import psycopg
from confluent_kafka import Consumer, TopicPartition

from bench.peers.common import COLUMNS, create_table, end_offsets, main


def json_order(value: bytes) -> tuple:
    """(order_id, customer, amount, placed_at) of one JSON order."""
    doc = orjson.loads(value)
    return (doc["order_id"], doc["customer"], Decimal(str(doc["amount"])),
            datetime.fromisoformat(doc["placed_at"]))


def run(topic: str, table: str, db_url: str, bootstrap: str,
        decode: Callable[[bytes], tuple] = json_order) -> int:
    """``decode``: a record's value -> its four order columns (JSON unless told)."""
    create_table(db_url, table)
    ends = end_offsets(bootstrap, topic)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "single-process",
                         "enable.auto.commit": False, "fetch.max.bytes": 64 << 20,
                         "max.partition.fetch.bytes": 16 << 20})
    consumer.assign([TopicPartition(topic, p, 0) for p, end in ends.items() if end > 0])
    remaining = {p for p, end in ends.items() if end > 0}
    written = 0
    cols = ", ".join(f'"{c}"' for c in COLUMNS)
    with psycopg.connect(db_url) as conn:
        conn.execute(f"CREATE TABLE IF NOT EXISTS {table}_offsets (topic text, "
                     '"partition" int, next_offset bigint, PRIMARY KEY (topic, "partition"))')
        with conn.cursor() as cur, cur.copy(
                f"COPY {table} ({cols}) FROM STDIN (FORMAT BINARY)") as copy:
            copy.set_types(["text", "int4", "int8", "timestamptz", "int8", "text", "numeric",
                            "timestamptz"])
            while remaining:
                for msg in consumer.consume(num_messages=10000, timeout=1.0):
                    if msg.error():
                        raise RuntimeError(msg.error())
                    p, o = msg.partition(), msg.offset()
                    if p not in remaining or o >= ends[p]:
                        continue
                    copy.write_row((topic, p, o,
                                    datetime.fromtimestamp(msg.timestamp()[1] / 1000, UTC),
                                    *decode(msg.value())))
                    written += 1
                    if o + 1 >= ends[p]:
                        remaining.discard(p)
        with conn.cursor() as cur:
            cur.executemany(f"INSERT INTO {table}_offsets VALUES (%s, %s, %s) ON CONFLICT "
                            '(topic, "partition") DO UPDATE SET next_offset = '
                            "EXCLUDED.next_offset", [(topic, p, e) for p, e in ends.items()])
        conn.commit()
    consumer.close()
    return written


if __name__ == "__main__":
    main(run)
