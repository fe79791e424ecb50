"""What the avro sink's rows cost Postgres (issue 26): N bench orders encoded by the avro
Encoder as COPY text lines and as COPY binary tuples (binary_fields.py), each COPYed in
alternated rounds into a fresh UNLOGGED table shaped like the results table (its types,
its primary key), in one process against the stack's Postgres; the backend's CPU-seconds
(its /proc stat: the same machine) and the encoder's, per round, and the rows' bytes.

    .venv/bin/python -m bench.avro_copy [N] [ROUNDS]   # PIPELINE_TEST_DATABASE_URL
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time

from psycopg import sql

from bench.avro_encoder import BATCH, COLUMNS, wire_orders
from bench.avro_orders import SCHEMA
from pipeline.formats.avro_schemas import SchemaSource
from pipeline.formats.encode import Encoder
from pipeline.store.copy_in import copy_in

TABLE = """CREATE UNLOGGED TABLE avro_copy_{i} (topic text, partition int, "offset" bigint,
kafka_timestamp timestamptz, order_id bigint NOT NULL, customer text NOT NULL,
amount numeric(12,2), placed_at timestamptz, run_id bigint,
ingested_at timestamptz DEFAULT now(), PRIMARY KEY (topic, partition, "offset"))"""
COPIED = "topic, partition, \"offset\", kafka_timestamp, order_id, customer, amount, " \
    "placed_at, run_id"


def backend_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def encoded(records: list, schemas: SchemaSource, text_rows: bool) -> tuple[list, float]:
    enc = Encoder("avro", COLUMNS, 1, schemas=schemas, text_rows=text_rows)
    start = time.process_time()
    blobs = [enc.wire.blob(enc.encode("t", 0, records[i:i + BATCH]).rows)
             for i in range(0, len(records), BATCH)]
    return blobs, time.process_time() - start


def copy(conn, i: int, blobs: list, binary: bool) -> float:
    """Backend CPU-seconds of COPYing ``blobs`` into a fresh table (created, then timed)."""
    with conn.cursor() as cur:
        cur.execute(f"DROP TABLE IF EXISTS avro_copy_{i}")
        cur.execute(TABLE.format(i=i))
        conn.commit()
        cur.execute("SELECT pg_backend_pid()")
        pid = cur.fetchone()[0]
        before = backend_cpu(pid)
        copy_in(cur, sql.Identifier(f"avro_copy_{i}"), sql.SQL(COPIED), blobs, binary)
        conn.commit()
        spent = backend_cpu(pid) - before
        cur.execute(f"DROP TABLE avro_copy_{i}")
        conn.commit()
    return spent


def main(argv: list[str]) -> int:
    import psycopg

    n = int(argv[0]) if argv else 2_000_000
    rounds = int(argv[1]) if len(argv) > 1 else 3
    records = wire_orders(n)
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/1.avsc", "w") as f:
            f.write(json.dumps(SCHEMA))
        schemas = SchemaSource(schemas_dir=tmp)
        with psycopg.connect(os.environ["PIPELINE_TEST_DATABASE_URL"]) as conn:
            for r in range(rounds):
                for label, text_rows in (("text", True), ("binary", False)):
                    blobs, enc_cpu = encoded(records, schemas, text_rows)
                    pg = copy(conn, r, blobs, not text_rows)
                    print(f"round {r} {label}: encoder {enc_cpu / n * 1e6:.2f} us a record, "
                          f"Postgres backend {pg:.2f} CPU-s, "
                          f"{sum(map(len, blobs)) / n:.1f} bytes a row, "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)
                    del blobs
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
