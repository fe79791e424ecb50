"""The stack's Schema Registry is a real one (Apicurio Registry, scripts/registry) that
confluent-kafka's SchemaRegistryClient speaks to as to Confluent's: schemas registered and
read back by id and by subject/version, compatibility enforced (BACKWARD by default, as
Confluent's), ids kept across a restart."""

from __future__ import annotations

import json
import subprocess

from confluent_kafka.schema_registry import Schema

from tests.helpers import ROOT, unique
from tests.integration._registry import registry_client

ORDER_V1 = {"type": "record", "name": "Order", "namespace": "test.registry",
            "fields": [{"name": "order_id", "type": "long"},
                       {"name": "amount", "type": "double"}]}
# Compatible (BACKWARD): a new optional field with a default.
ORDER_V2 = {**ORDER_V1, "fields": ORDER_V1["fields"] + [
    {"name": "note", "type": ["null", "string"], "default": None}]}
# Incompatible: a new required field, which v1 records cannot fill.
ORDER_V3 = {**ORDER_V1, "fields": ORDER_V1["fields"] + [{"name": "customer", "type": "string"}]}


def avro(schema: dict) -> Schema:
    return Schema(json.dumps(schema), "AVRO")


def test_an_avro_schema_is_registered_read_back_and_evolved(registry):
    client = registry_client(registry)
    subject = f"{unique('orders')}-value"

    v1_id = client.register_schema(subject, avro(ORDER_V1))
    assert v1_id > 0
    assert client.register_schema(subject, avro(ORDER_V1)) == v1_id, "same schema, same id"

    by_id = client.get_schema(v1_id)
    assert by_id.schema_type == "AVRO"
    assert json.loads(by_id.schema_str) == ORDER_V1
    version = client.get_version(subject, 1)
    assert (version.schema_id, version.subject, version.version) == (v1_id, subject, 1)
    assert json.loads(version.schema.schema_str) == ORDER_V1
    assert subject in client.get_subjects()

    # Confluent's default, set globally by scripts/registry (Apicurio's own is NONE).
    assert client.get_compatibility() == "BACKWARD"
    assert client.test_compatibility(subject, avro(ORDER_V2)) is True
    assert client.test_compatibility(subject, avro(ORDER_V3)) is False
    client.set_compatibility(subject, "NONE")  # a subject's own level overrides it
    assert client.get_compatibility(subject) == "NONE"
    assert client.test_compatibility(subject, avro(ORDER_V3)) is True
    client.set_compatibility(subject, "BACKWARD")

    v2_id = client.register_schema(subject, avro(ORDER_V2))
    assert v2_id != v1_id
    latest = client.get_latest_version(subject)
    assert (latest.schema_id, latest.version) == (v2_id, 2)
    assert client.get_versions(subject) == [1, 2]


def test_schema_ids_outlive_a_registry_restart(registry):
    """Records carry schema ids: a restarted registry must still resolve them (its H2
    database is a file under the stack's folder, not memory)."""
    client = registry_client(registry)
    subject = f"{unique('restart')}-value"
    schema_id = client.register_schema(subject, avro(ORDER_V1))

    script = str(ROOT / "scripts" / "registry")
    subprocess.run([script, "down"], check=True)
    subprocess.run([script, "up"], check=True)

    fresh = registry_client(registry)  # no client-side cache
    assert json.loads(fresh.get_schema(schema_id).schema_str) == ORDER_V1
    assert fresh.get_latest_version(subject).schema_id == schema_id
