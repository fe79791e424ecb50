"""The single Python process (bench/peers/single_process.py) on the Avro topic: each
record's 5-byte Confluent header read, its writer schema fetched from the registry once per
schema id (SCHEMA_REGISTRY_URL), the body decoded with fastavro; one binary COPY, offsets
in the same transaction."""

from __future__ import annotations

import io
import json

import fastavro

from bench.avro_orders import REGISTRY_URL
from bench.peers import single_process
from bench.peers.common import main


def avro_decoder():
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient({"url": REGISTRY_URL, "timeout": 20})
    schemas: dict[int, dict] = {}

    def decode(value: bytes) -> tuple:
        if value[0] != 0:
            raise ValueError(f"not the Confluent wire format: magic byte {value[0]}")
        schema_id = int.from_bytes(value[1:5], "big")
        if schema_id not in schemas:
            text = client.get_schema(schema_id).schema_str
            schemas[schema_id] = fastavro.parse_schema(json.loads(text))
        doc = fastavro.schemaless_reader(io.BytesIO(value[5:]), schemas[schema_id], None)
        return doc["order_id"], doc["customer"], doc["amount"], doc["placed_at"]

    return decode


def run(topic: str, table: str, db_url: str, bootstrap: str) -> int:
    return single_process.run(topic, table, db_url, bootstrap, decode=avro_decoder())


if __name__ == "__main__":
    main(run)
