"""The avro format's encoding CPU per record (issue 26), in one process, no stack: N bench
orders in the Confluent wire format (written here with fastavro, schema id 1 from a
temporary schemas_dir) through the Encoder as an executor runs it, in batches of 10,000;
in alternated rounds the general path alone (the generated loop switched off: the code
before it), the generated batch loop (formats/avro_rows.py) decoding with fastavro, the
same with its generated decode (formats/avro_decode.py) writing COPY text lines (what a
transform's feed reads) and writing COPY binary tuples (binary_fields.py: what a run
stages), and the json sink on the same orders.

    .venv/bin/python -m bench.avro_encoder [N] [ROUNDS]
"""

from __future__ import annotations

import io
import json
import statistics
import sys
import tempfile
import time

from bench.avro_orders import SCHEMA, avro_order
from bench.harness import Message
from pipeline.formats import avro_format, avro_rows
from pipeline.formats.avro_schemas import SchemaSource
from pipeline.formats.encode import Encoder
from pipeline.sample import order

COLUMNS = (("order_id", "long", True), ("customer", "string", True),
           ("amount", "decimal(12,2)", False), ("placed_at", "timestamp", False))
BATCH = 10_000


def _message(o: int, v: bytes) -> Message:
    return Message(o, v, 1_700_000_000_000 + o // 100)  # a producer batch shares its time


def wire_orders(n: int) -> list[Message]:
    import fastavro

    parsed = fastavro.parse_schema(SCHEMA, named_schemas={})
    out = []
    for i in range(n):
        buf = io.BytesIO(b"\x00\x00\x00\x00\x01")
        buf.seek(5)
        fastavro.schemaless_writer(buf, parsed, avro_order(i))
        out.append(_message(i, buf.getvalue()))
    return out


def us_per_record(fmt: str, records: list, schemas: SchemaSource | None,
                  text_rows: bool = True) -> float:
    enc = Encoder(fmt, COLUMNS, 1, schemas=schemas, text_rows=text_rows)
    start = time.process_time()
    for i in range(0, len(records), BATCH):
        encoded = enc.encode("t", 0, records[i:i + BATCH])
        assert not encoded.dead and len(encoded.rows) == len(records[i:i + BATCH])
    return (time.process_time() - start) / len(records) * 1e6


def report(got: dict[str, list[float]], n: int, rounds: int) -> None:
    """Each variant's median us a record over the rounds, with its min and max."""
    for k, v in got.items():
        print(f"{k}: median {statistics.median(v):.2f} us a record (min {min(v):.2f}, "
              f"max {max(v):.2f}, {n:,} orders, {rounds} rounds)")


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 200_000
    rounds = int(argv[1]) if len(argv) > 1 else 5
    avro = wire_orders(n)
    js = [_message(i, order(i)) for i in range(n)]
    loop, decoder = avro_format.batch_encoder, avro_rows.decoder
    got: dict[str, list[float]] = {"general path (before)": [], "loop, fastavro": [],
                                   "loop, generated decode": [],
                                   "loop, generated decode, binary": [], "json sink": []}
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/1.avsc", "w") as f:
            f.write(json.dumps(SCHEMA))
        schemas = SchemaSource(schemas_dir=tmp)
        for r in range(rounds):
            avro_format.batch_encoder = lambda columns, schema=None, binary=False: None
            got["general path (before)"].append(us_per_record("avro", avro, schemas))
            avro_format.batch_encoder = loop
            avro_rows.decoder = lambda schema, paths=None: None
            got["loop, fastavro"].append(us_per_record("avro", avro, schemas))
            avro_rows.decoder = decoder
            got["loop, generated decode"].append(us_per_record("avro", avro, schemas))
            got["loop, generated decode, binary"].append(
                us_per_record("avro", avro, schemas, text_rows=False))
            got["json sink"].append(us_per_record("json", js, None))
            print(f"round {r}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in got.items())
                  + " us a record", flush=True)
    report(got, n, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
