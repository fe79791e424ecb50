"""COPY text result lines -> a typed Arrow batch: formats/arrow_rows.RowReader against the
per-field read-back (copy_readback: split, reader per field, pa.array per column).

    PYTHONPATH=. .venv/bin/python -m bench.arrow_rows [RECORDS] [ROUNDS]

The lines are what the real Encoder writes for N JSON orders (pipeline.sample.order:
order_id long, customer string, amount decimal(12,2), placed_at timestamp; 8 result
columns with topic, partition, offset, kafka_timestamp). CPU seconds of this process
(time.process_time), the two readers in turns, ROUNDS rounds; prints us per record.
No Kafka, no Spark.
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import pyarrow as pa  # noqa: E402

from bench.harness import Message  # noqa: E402
from pipeline.formats import copy_readback as dc  # noqa: E402
from pipeline.formats.arrow_rows import RowReader, micros  # noqa: E402
from pipeline.formats.copy_text import NULL, unescape  # noqa: E402
from pipeline.formats.encode import Encoder  # noqa: E402
from pipeline.sample import order  # noqa: E402

COLUMNS = (("order_id", "long", True), ("customer", "string", True),
           ("amount", "decimal(12,2)", False), ("placed_at", "timestamp", False))


def _message(o: int, v: bytes, ms: int | None = None) -> Message:
    return Message(o, v, 1_700_000_000_000 + o if ms is None else ms)


def lines(n: int, variant: str = "orders") -> list[str]:
    """The Encoder's lines of n orders; ``variant`` "long_amounts": each amount a float
    with more places than decimal(12,2) (rounded in Arrow, arrow_rows._rounded);
    "far_kafka_timestamp": one record's Kafka timestamp past year 9999 (that column read
    field by field)."""
    records = [_message(i, order(i)) for i in range(n)]
    if variant == "long_amounts":
        records = [_message(i, order(i).replace(b'"amount": ', f'"amount": {i / 7!r}, "_": '
                                               .encode())) for i in range(n)]
    elif variant == "far_kafka_timestamp":
        records[n // 2] = _message(n // 2, order(n // 2), 300_000_000_000_000)
    encoded = Encoder("json", COLUMNS, 1).encode("orders", 0, records)
    assert not encoded.dead and len(encoded.rows) == n
    return encoded.rows


def per_field(rows: list[str]) -> pa.RecordBatch:
    """The same batch read field by field, as copy_readback reads the declared columns
    (here the head too, for the same 8 columns)."""
    head = [("topic", unescape, pa.string()), ("partition", int, pa.int32()),
            ("offset", int, pa.int64()), ("kafka_timestamp", micros, pa.int64())]
    readers = head + [(n, dc.reader(t), dc.arrow_type(t, pa)) for n, t, _ in COLUMNS]
    columns: list[list] = [[] for _ in readers]
    appends = [c.append for c in columns]
    for line in rows:
        fields = line.rstrip("\n").split("\t")
        for append, (_, read, _), field in zip(appends, readers, fields, strict=False):
            append(None if field == NULL else read(field))
    arrays = [pa.array(c, t) for c, (_, _, t) in zip(columns, readers, strict=True)]
    arrays[3] = arrays[3].cast(pa.timestamp("us", tz="UTC"))
    return pa.RecordBatch.from_arrays(arrays, names=[n for n, _, _ in readers])


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 200_000
    rounds = int(argv[1]) if len(argv) > 1 else 5
    rows = lines(n)
    reader = RowReader(COLUMNS)
    assert reader.batch(rows).equals(per_field(rows))  # the same batch, or no timing
    times: dict[str, list[float]] = {"arrow_rows": [], "per_field": []}
    for _ in range(rounds):
        for name, fn in (("arrow_rows", reader.batch), ("per_field", per_field)):
            t0 = time.process_time()
            fn(rows)
            times[name].append((time.process_time() - t0) / n * 1e6)
    for name, us in times.items():
        print(f"{name:10} us/record: min {min(us):.3f}  median {statistics.median(us):.3f}  "
              f"max {max(us):.3f}  ({n:,} lines, {rounds} rounds)")
    ratio = statistics.median(times["per_field"]) / statistics.median(times["arrow_rows"])
    print(f"per_field / arrow_rows: {ratio:.1f}x")
    for variant in ("long_amounts", "far_kafka_timestamp"):
        rows = lines(n, variant)
        us = []
        for _ in range(rounds):
            t0 = time.process_time()
            reader.batch(rows)
            us.append((time.process_time() - t0) / n * 1e6)
        print(f"arrow_rows, {variant}: median {statistics.median(us):.3f} us/record")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
