"""Sample data for the demo and the benchmarks: order events, some deliberately bad.

    python -m pipeline.sample --topic demo_orders --records 1000 --partitions 3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from datetime import UTC, datetime, timedelta

from confluent_kafka import Producer
from confluent_kafka.admin import AdminClient, NewPartitions, NewTopic

BAD_VALUES = [
    b"{not json",                                      # malformed JSON
    b'{"order_id": "seven", "customer": "c1"}',        # wrong type
    b'{"amount": 3.5}',                                # missing required fields
    b"\xff\xfe\x00 not utf-8",                         # invalid UTF-8
    None,                                              # tombstone
]


def ensure_topic(bootstrap: str, topic: str, partitions: int, **config: str) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    md = admin.list_topics(timeout=10)
    if topic in md.topics:
        have = len(md.topics[topic].partitions)
        if have < partitions:
            admin.create_partitions([NewPartitions(topic, partitions)])[topic].result()
        return
    fut = admin.create_topics([NewTopic(topic, partitions, 1, config=config)])[topic]
    fut.result()


def order(i: int) -> bytes:
    placed = datetime(2026, 1, 1, tzinfo=UTC) + timedelta(minutes=i)
    return json.dumps({"order_id": i, "customer": f"c{i % 97}", "amount": round(i * 1.25, 2),
                       "placed_at": placed.isoformat()}).encode()


def produce(bootstrap: str, topic: str, records: int, *, start: int = 0, bad_every: int = 0,
            partitions: int | None = None) -> int:
    """Keyed records spread over partitions; every bad_every-th record is bad."""
    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20,
                         "enable.idempotence": True})
    bad = 0
    for i in range(start, start + records):
        if bad_every and i % bad_every == bad_every - 1:
            value = BAD_VALUES[(i // bad_every) % len(BAD_VALUES)]
            bad += 1
        else:
            value = order(i)
        kwargs = {"partition": i % partitions} if partitions else {}
        producer.produce(topic, key=f"order-{i}".encode(), value=value,
                         headers=[("source", b"sample"), ("seq", str(i).encode())], **kwargs)
        if i % 10000 == 0:
            producer.poll(0)
    if producer.flush(30) != 0:
        raise RuntimeError(f"could not deliver all records to {topic}")
    return bad


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m pipeline.sample", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    # The same variable the pipeline reads (pipeline/settings/env.py), so that one export
    # points both at the broker.
    p.add_argument("--bootstrap", default=os.environ.get("PIPELINE__KAFKA__BOOTSTRAP_SERVERS",
                                                         "127.0.0.1:9092"))
    p.add_argument("--topic", default="demo_orders")
    p.add_argument("--partitions", type=int, default=3)
    p.add_argument("--records", type=int, default=1000)
    p.add_argument("--start", type=int, default=0, help="first order id")
    p.add_argument("--bad-every", type=int, default=50,
                   help="every Nth record is malformed (0 = none)")
    a = p.parse_args(argv)
    ensure_topic(a.bootstrap, a.topic, a.partitions)
    bad = produce(a.bootstrap, a.topic, a.records, start=a.start, bad_every=a.bad_every,
                  partitions=a.partitions)
    print(f"produced {a.records} records to {a.topic} ({bad} deliberately bad)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
