"""What a transform's rows cost Postgres (issue 25): N bench orders as the Arrow batches a
transform's writer gets (pipeline.sample.order's values, 10,000 rows a batch, the topic a
fixed literal), made COPY text lines (formats/arrow_copy.py) and COPY binary tuples
(formats/arrow_binary.py), each COPYed in alternated rounds into a fresh UNLOGGED table
shaped like the results table (its types, its primary key), in one process against the
stack's Postgres; the backend's CPU-seconds, the writer's (per record), and the rows' bytes.

    .venv/bin/python -m bench.transform_copy [N] [ROUNDS]   # PIPELINE_TEST_DATABASE_URL
"""

from __future__ import annotations

import os
import sys
import time
from datetime import UTC, datetime

from bench.avro_copy import COPIED, TABLE, copy

BATCH = 10_000
STAGED = [("topic", "text"), ("partition", "integer"), ("offset", "bigint"),
          ("kafka_timestamp", "timestamp with time zone"), ("order_id", "bigint"),
          ("customer", "text"), ("amount", "numeric(12,2)"),
          ("placed_at", "timestamp with time zone")]
assert ", ".join(f'"{n}"' if n == "offset" else n for n, _ in STAGED) + ", run_id" == COPIED
assert "amount numeric(12,2)" in TABLE


def batches(n: int) -> list:
    """The orders as a transform's writer receives them (sample.order's values)."""
    import numpy as np
    import pyarrow as pa

    start = int(datetime(2026, 1, 1, tzinfo=UTC).timestamp() * 1_000_000)
    out = []
    for lo in range(0, n, BATCH):
        i = np.arange(lo, min(n, lo + BATCH), dtype=np.int64)
        out.append(pa.RecordBatch.from_arrays([
            pa.array((i % 4).astype(np.int32)), pa.array(i),
            pa.array(start + i * 1000, pa.timestamp("us", tz="UTC")), pa.array(i),
            pa.array([f"c{k}" for k in (i % 97).tolist()]),
            _decimal(i * 125, np, pa),  # round(i * 1.25, 2), unscaled
            pa.array(start + i * 60_000_000, pa.timestamp("us", tz="UTC"))],
            names=[c[0] for c in STAGED[1:]]))
    return out


def _decimal(unscaled, np, pa):
    """decimal(12,2) values from their unscaled int64s (Arrow's two little-endian words)."""
    words = np.stack([unscaled, unscaled >> 63], axis=1)
    return pa.Array.from_buffers(pa.decimal128(12, 2), len(unscaled),
                                 [None, pa.py_buffer(words)])


def encoded(data: list, binary: bool) -> tuple[list, float]:
    import pyarrow as pa
    import pyarrow.compute as pc

    from pipeline.executor.blobs import contiguous
    from pipeline.formats import arrow_binary, arrow_copy

    encode = arrow_binary.tuples if binary else arrow_copy.lines
    start = time.process_time()
    blobs = [contiguous(encode(b, STAGED, 1, pa, pc, {"topic": "t"}), pa) for b in data]
    return blobs, time.process_time() - start


def main(argv: list[str]) -> int:
    import psycopg

    n = int(argv[0]) if argv else 2_000_000
    rounds = int(argv[1]) if len(argv) > 1 else 3
    data = batches(n)
    with psycopg.connect(os.environ["PIPELINE_TEST_DATABASE_URL"]) as conn:
        for r in range(rounds):
            for label, binary in (("text", False), ("binary", True)):
                blobs, cpu = encoded(data, binary)
                pg = copy(conn, r, blobs, binary)
                print(f"round {r} {label}: writer {cpu / n * 1e6:.2f} us a record, "
                      f"Postgres backend {pg:.2f} CPU-s, "
                      f"{sum(map(len, blobs)) / n:.1f} bytes a row, "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)
                del blobs
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
