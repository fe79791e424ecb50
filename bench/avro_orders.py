"""The orders as Avro in the Confluent wire format (magic byte 0, the 4-byte schema id, the
Avro binary encoding), through the stack's real Schema Registry (scripts/registry, the
Confluent API): the schema registered under ``<topic>-value``, each record written by
confluent-kafka's AvroSerializer, as a producer of such a topic writes them. The values are
pipeline.sample.order's, so every contender's table verifies against the same numbers."""

from __future__ import annotations

import json
import os
from datetime import datetime
from decimal import Decimal

from pipeline.sample import order

REGISTRY_URL = os.environ.get(
    "SCHEMA_REGISTRY_URL",
    f"http://127.0.0.1:{os.environ.get('REGISTRY_PORT', '8381')}/apis/ccompat/v7")
# The declared columns' types as Avro logical types: decimal(12,2), timestamp.
SCHEMA = {"type": "record", "name": "Order", "namespace": "bench", "fields": [
    {"name": "order_id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                "scale": 2}},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
]}


def avro_order(i: int) -> dict:
    """Order i of the generator, with its amount a Decimal and its time a datetime."""
    doc = json.loads(order(i))
    return {**doc, "amount": Decimal(str(doc["amount"])),
            "placed_at": datetime.fromisoformat(doc["placed_at"])}


def serializer(topic: str):
    """value(i) -> order i in the wire format, under the schema registered for the topic."""
    from confluent_kafka.schema_registry import Schema, SchemaRegistryClient
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    client = SchemaRegistryClient({"url": REGISTRY_URL, "timeout": 20})
    text = json.dumps(SCHEMA)
    client.register_schema(f"{topic}-value", Schema(text, "AVRO"))
    ser = AvroSerializer(client, text, conf={"auto.register.schemas": False,
                                             "use.latest.version": False})
    ctx = SerializationContext(topic, MessageField.VALUE)
    return lambda i: ser(avro_order(i), ctx)


def writer_schema(topic: str) -> str:
    """The topic's latest registered value schema: what a Spark user passes to from_avro,
    which takes the writer schema itself (no registry lookup in Apache Spark)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    client = SchemaRegistryClient({"url": REGISTRY_URL, "timeout": 20})
    return client.get_latest_version(f"{topic}-value").schema.schema_str
