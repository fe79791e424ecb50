"""The textbook consumer loop: poll one message, json.loads, executemany per 1,000 rows,
commit the database, then commit Kafka."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import psycopg
from confluent_kafka import Consumer

from bench.peers.common import create_table, end_offsets, main

BATCH = 1000


def run(topic: str, table: str, db_url: str, bootstrap: str) -> int:
    create_table(db_url, table)
    ends = end_offsets(bootstrap, topic)
    remaining = {p for p, end in ends.items() if end > 0}
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"textbook-{uuid.uuid4()}",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    consumer.subscribe([topic])
    insert = (f'INSERT INTO {table} (topic, "partition", "offset", kafka_timestamp, order_id, '
              "customer, amount, placed_at) VALUES (%s, %s, %s, %s, %s, %s, %s, %s) "
              'ON CONFLICT (topic, "partition", "offset") DO NOTHING')
    rows, written = [], 0
    with psycopg.connect(db_url) as conn:
        while remaining:
            msg = consumer.poll(1.0)
            if msg is None:
                continue
            if msg.error():
                raise RuntimeError(msg.error())
            doc = json.loads(msg.value())
            rows.append((msg.topic(), msg.partition(), msg.offset(),
                         datetime.fromtimestamp(msg.timestamp()[1] / 1000, UTC),
                         doc["order_id"], doc["customer"], doc["amount"], doc["placed_at"]))
            if msg.offset() + 1 >= ends[msg.partition()]:
                remaining.discard(msg.partition())
            if len(rows) >= BATCH or not remaining:
                with conn.cursor() as cur:
                    cur.executemany(insert, rows)
                conn.commit()
                consumer.commit(asynchronous=False)
                written += len(rows)
                rows = []
    consumer.close()
    return written


if __name__ == "__main__":
    main(run)
