"""The avro format on the real stack (Kafka, Postgres, Spark): ~500 records in the Confluent
wire format under two writer-schema versions from a schemas_dir (v2 adds a field, drops an
optional one, promotes int -> long and float -> double), with logical types, plus a few bad
ones. One run: the table exactly what was produced, each bad record a dead letter with its
reason, the offsets at the end of the log; the unknown schema added, its dead letter
replays. A registry that cannot be reached: exit 75 and
nothing committed. The real registry (a server speaking the Confluent API) is tested in
its own file."""

from __future__ import annotations

import io
import json
import struct
import uuid
from datetime import UTC, date, datetime, timedelta
from decimal import Decimal

import fastavro
import pytest

from pipeline.config import parse_settings
from pipeline.driver.job import run_ingest
from pipeline.driver.replay import run_replay
from pipeline.errors import EXIT_TRANSIENT, TransientError
from pipeline.store.dead_letters import DeadLetterFilter
from tests.helpers import (
    BOOTSTRAP,
    TEST_DB_URL,
    create_topic,
    produce,
    query,
    stored_offsets,
    unique,
    watermarks,
)
from tests.integration._reliability import init_db

pytestmark = pytest.mark.integration

V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "int"},
    {"name": "customer", "type": "string"},
    {"name": "price", "type": "float"},
    {"name": "coupon", "type": ["null", "string"], "default": None},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                "scale": 2}},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
]}
V2 = {**V1, "fields": [
    {"name": "order_id", "type": "long"},
    {"name": "customer", "type": "string"},
    {"name": "price", "type": "double"},
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 12,
                                "scale": 2}},
    {"name": "placed_at", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "ref", "type": {"type": "string", "logicalType": "uuid"}},
    {"name": "channel", "type": "string", "default": "web"},
]}
COLUMNS = {"order_id": "long not null", "customer": "string not null", "price": "double",
           "coupon": "string", "amount": "decimal(12,2)", "placed_at": "timestamp",
           "day": "date", "ref": "string"}
N = 500
T0 = datetime(2024, 5, 1, tzinfo=UTC)


def wire(schema_id: int, schema: dict, value: dict) -> bytes:
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema, named_schemas={}), value)
    return out.getvalue()


def order(i: int) -> tuple[bytes, tuple]:
    """(the value, the row it must become): even ids v1, odd ids v2."""
    v2 = i % 2 == 1
    at = T0 + timedelta(seconds=i, microseconds=(i * 7 if v2 else i * 1000) % 1_000_000)
    value = {"order_id": i, "customer": f"c{i % 17}", "price": i + 0.25,
             "amount": Decimal(i * 3) / 4, "placed_at": at, "day": date(2024, 1, 1 + i % 28),
             "ref": uuid.UUID(int=i)}
    if v2:
        value["channel"] = "app"
        row = (i, f"c{i % 17}", i + 0.25, None)
    else:
        value["coupon"] = f"K{i}" if i % 3 == 0 else None
        row = (i, f"c{i % 17}", i + 0.25, value["coupon"])
    row += (Decimal(i * 3 / 4).quantize(Decimal("0.01")), at, value["day"], str(uuid.UUID(int=i)))
    return wire(2 if v2 else 1, V2 if v2 else V1, value), row


def settings(name: str, topic: str, registry: dict):
    return parse_settings({
        "pipeline": {"name": name},
        "kafka": {"bootstrap_servers": BOOTSTRAP, "topics": [topic], "timeout_seconds": 10},
        "database": {"url": TEST_DB_URL},
        "sink": {"format": "avro", "table": name, "max_bad_records": -1, "columns": COLUMNS},
        "schema_registry": registry,
        "spark": {"master": "local[2]"},
    }, source=f"<test {name}>", environ={})


@pytest.fixture(scope="module")
def schemas_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("avsc")
    (folder / "1.avsc").write_text(json.dumps(V1))
    (folder / "2.avsc").write_text(json.dumps(V2))
    return folder


def test_two_schema_versions_land_exactly_and_bad_records_are_dead_letters(schemas_dir, spark):
    name = unique("avro")
    topic = create_topic(name, partitions=2)
    produced = [order(i) for i in range(N)]
    good = wire(1, V1, {"order_id": 1, "customer": "x", "price": 1.0, "amount": Decimal(1),
                        "placed_at": T0, "day": date(2024, 1, 1), "ref": uuid.UUID(int=1)})
    truncated_v2 = produced[1][0][:-1]
    bad = {b'{"order_id": 1}': "bad_magic_byte",
           good[:1] + struct.pack(">I", 42) + good[5:]: "unknown_schema",
           good[:-4]: "corrupt_avro",
           truncated_v2: "corrupt_avro"}
    records = [(str(i).encode(), v) for i, (v, _) in enumerate(produced)]
    records[100:100] = [(b"bad", v) for v in bad]
    produce(topic, records)
    s = init_db(settings(name, topic, {"schemas_dir": str(schemas_dir)}))

    result = run_ingest(s)

    assert (result.status, result.records_read, result.rows_written, result.dead_letters) == (
        "succeeded", N + len(bad), N, len(bad))
    rows = query(f"SELECT order_id, customer, price, coupon, amount, placed_at, day, ref "
                 f"FROM {name} ORDER BY order_id")
    assert rows == [row for _, row in produced]
    dead = query("SELECT error_type, error_message, value FROM pipeline_dead_letters "
                 "WHERE pipeline = %s ORDER BY error_type, error_message", (name,))
    assert sorted((t, bytes(v)) for t, _, v in dead) == sorted((t, v) for v, t in bad.items())
    reasons = {t: m for t, m, _ in dead}
    assert "schema id 42 is not in" in reasons["unknown_schema"]
    assert "first byte is 0x7b" in reasons["bad_magic_byte"]
    ends = {(topic, p): high for p, (_, high) in watermarks(topic).items()}
    assert stored_offsets(name) == ends and sum(ends.values()) == N + len(bad)

    # The missing schema registered (here: its file added), the dead letter replays.
    (schemas_dir / "42.avsc").write_text(json.dumps(V1))
    report = run_replay(s, DeadLetterFilter(error_type="unknown_schema"))
    assert (report.replayed, report.still_failing) == (1, 0)
    assert query(f"SELECT order_id, customer FROM {name} WHERE customer = 'x'") == [(1, "x")]


def test_an_unreachable_registry_is_exit_75_and_nothing_is_committed(spark):
    name = unique("avro_down")
    topic = create_topic(name, partitions=1)
    produce(topic, [(b"k", order(i)[0]) for i in range(5)])
    s = init_db(settings(name, topic, {"url": "http://127.0.0.1:9", "timeout_seconds": 2}))

    with pytest.raises(TransientError) as e:
        run_ingest(s)

    assert e.value.exit_code == EXIT_TRANSIENT
    assert "schema registry http://127.0.0.1:9 unreachable fetching schema id" in str(e.value)
    assert stored_offsets(name) == {} and query(f"SELECT count(*) FROM {name}") == [(0,)]


def test_evolve_adds_a_declared_column_the_writer_schema_gained(schemas_dir, spark):
    """[sink] evolve = "add_columns" with avro: v2 of the schema adds channel; declared in
    [sink.columns], the run adds the column, v2 records fill it, older rows stay NULL."""
    from dataclasses import replace

    from tests.integration.test_evolve import grant_evolve

    name = unique("avro_evolve")
    topic = create_topic(name, partitions=1)
    produce(topic, [(b"k", order(i)[0]) for i in range(0, 8, 2)])  # v1
    s = init_db(settings(name, topic, {"schemas_dir": str(schemas_dir)}))
    grant_evolve(name)
    assert run_ingest(s).rows_written == 4
    produce(topic, [(b"k", order(i)[0]) for i in range(1, 8, 2)])  # v2: channel "app"
    evolved = parse_settings({
        "pipeline": {"name": name},
        "kafka": {"bootstrap_servers": BOOTSTRAP, "topics": [topic], "timeout_seconds": 10},
        "database": {"url": TEST_DB_URL},
        "sink": {"format": "avro", "table": name, "max_bad_records": -1, "evolve": "add_columns",
                 "columns": {**COLUMNS, "channel": "string"}},
        "schema_registry": {"schemas_dir": str(schemas_dir)},
        "spark": {"master": "local[2]"}}, source="<test>", environ={})

    result = run_ingest(replace(evolved, database_url=s.database_url))

    assert result.rows_written == 4
    assert query(f"SELECT order_id, channel FROM {name} ORDER BY 1") == [
        (i, "app" if i % 2 else None) for i in range(8)]
