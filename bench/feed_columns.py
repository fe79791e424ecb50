"""The transform feed's reader work per record, in one process: the lines' path
(Encoder.encode -> COPY text -> arrow_rows) against the columns' path
(typed_rows.feed_converter: Encoder.columns -> arrow_columns), and the writer's COPY lines
(arrow_copy.lines) of the same batches.

    PYTHONPATH=. .venv/bin/python -m bench.feed_columns [RECORDS] [ROUNDS] [TOPIC]

RECORDS JSON orders (pipeline.sample.order, 4 declared columns), in batches of 10,000 as
consume.read_ranges hands them over: read from TOPIC's partition 0 when given (real
confluent-kafka Messages, the stack's broker), else made in memory (bench.harness.Message,
producer-like timestamps: 50 records a millisecond). CPU seconds of this process
(time.process_time), the paths in turns, ROUNDS rounds; prints us per record.
"""

from __future__ import annotations

import statistics
import sys
import time

import pyarrow as pa
import pyarrow.compute as pc

from bench.harness import BOOTSTRAP, Message
from pipeline.executor.task import EncoderSettings
from pipeline.formats import arrow_copy
from pipeline.formats import typed_rows as tr
from pipeline.sample import order

COLUMNS = (("order_id", "long", True), ("customer", "string", True),
           ("amount", "decimal(12,2)", False), ("placed_at", "timestamp", False))
STAGED = [("topic", "text"), ("partition", "integer"), ("offset", "bigint"),
          ("kafka_timestamp", "timestamp with time zone"), ("order_id", "bigint"),
          ("customer", "text"), ("amount", "numeric(12,2)"),
          ("placed_at", "timestamp with time zone")]
BATCH = 10_000


def from_topic(topic: str, n: int) -> list:
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "bench-feed-columns",
                  "enable.auto.commit": False})
    c.assign([TopicPartition(topic, 0, 0)])
    out: list = []
    while len(out) < n:
        got = c.consume(BATCH, 10)
        if not got:
            break
        out += [m for m in got if m.error() is None]
    c.close()
    return out[:n]


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 500_000
    rounds = int(argv[1]) if len(argv) > 1 else 5
    records = (from_topic(argv[2], n) if len(argv) > 2 else
               [Message(i, order(i), 1_700_000_000_000 + i // 50) for i in range(n)])
    n = len(records)
    batches = [records[i:i + BATCH] for i in range(0, n, BATCH)]
    encoder = EncoderSettings("json", COLUMNS, 1, (), None).encoder()
    lines = tr.converter("json", COLUMNS, pa)
    columns = tr.feed_converter(encoder, "json", COLUMNS, pa)
    typed = [columns("orders", 0, b)[0] for b in batches]
    for b, t in zip(batches, typed, strict=True):  # the same batch, or no timing
        want = lines("orders", 0, b, encoder.encode("orders", 0, b))[0]
        assert t.equals(want)

    def via_lines():
        for b in batches:
            lines("orders", 0, b, encoder.encode("orders", 0, b))

    def via_columns():
        for b in batches:
            columns("orders", 0, b)

    def copy_lines():
        for t in typed:
            arrow_copy.lines(t, STAGED, 1, pa, pc)

    times: dict[str, list[float]] = {"lines": [], "columns": [], "writer": []}
    for _ in range(rounds):
        for name, fn in (("lines", via_lines), ("columns", via_columns),
                         ("writer", copy_lines)):
            start = time.process_time()
            fn()
            times[name].append((time.process_time() - start) / n * 1e6)
    for name, ts in times.items():
        print(f"{name}: us per record min {min(ts):.3f} median {statistics.median(ts):.3f} "
              f"max {max(ts):.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
