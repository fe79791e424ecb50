"""``[sink] columns = "schema"`` through the CLI: Debezium change events in Kafka Connect's
JSON schema envelope (a NUMERIC without precision as VariableScaleDecimal, a numeric(14,2)
as Connect's Decimal, microsecond and zoned timestamps, optional and required fields, the
key in the Kafka key's schema). init-db makes the table from the topic's writer schema; a
run lands the rows exactly, each balance with its own scale; a field the source adds later
is exit 2 naming the ALTER with evolve off, and a new column with evolve = "add_columns";
verify compares each balance with its scale. A topic without the envelope is one exit-2
line naming the topic and the fix. The same from Avro: the writer schema by its id
([schema_registry] schemas_dir, the registry's files). And the decimal type from plain JSON
numbers, beside a decimal(p,s)."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from decimal import Decimal
from pathlib import Path

import pytest

from pipeline.errors import EXIT_CONFIG, EXIT_DATA, EXIT_OK
from tests.helpers import (
    BOOTSTRAP,
    TEST_DB_URL,
    cli_here,
    create_topic,
    make_settings,
    produce,
    query,
    unique,
)
from tests.unit.test_debezium_avro import PRICE, SOURCE, envelope_schema, key_schema, wire

pytestmark = pytest.mark.integration

T0 = datetime(2026, 3, 1, 10, 0, 0, 123456, tzinfo=UTC)
FIELDS = [
    {"field": "id", "type": "int64", "optional": False},
    {"field": "name", "type": "string", "optional": True},
    {"field": "balance", "type": "struct", "optional": True,
     "name": "io.debezium.data.VariableScaleDecimal", "fields": [
         {"field": "scale", "type": "int32", "optional": False},
         {"field": "value", "type": "bytes", "optional": False}]},
    {"field": "total", "type": "bytes", "optional": False,
     "name": "org.apache.kafka.connect.data.Decimal",
     "parameters": {"scale": "2", "connect.decimal.precision": "14"}},
    {"field": "placed_at", "type": "int64", "optional": False,
     "name": "io.debezium.time.MicroTimestamp"},
    {"field": "updated_at", "type": "string", "optional": True,
     "name": "io.debezium.time.ZonedTimestamp"}]
CHANNEL = {"field": "channel", "type": "string", "optional": True}
KEY_SCHEMA = {"type": "struct", "optional": False,
              "fields": [{"field": "id", "type": "int64", "optional": False}]}


def envelope(fields: list[dict]) -> dict:
    return {"type": "struct", "name": "shop.public.accounts.Envelope", "optional": False,
            "fields": [{"field": "before", "type": "struct", "optional": True, "fields": fields},
                       {"field": "after", "type": "struct", "optional": True, "fields": fields},
                       {"field": "op", "type": "string", "optional": False}]}


def unscaled(d: Decimal) -> tuple[str, int]:
    """A decimal's two's-complement unscaled bytes (base64), and its scale."""
    sign, digits, exponent = d.as_tuple()
    n = int("".join(map(str, digits))) * (-1 if sign else 1)
    return base64.b64encode(n.to_bytes(n.bit_length() // 8 + 1, "big", signed=True)).decode(), \
        -exponent


def image(row: dict) -> dict:
    """A source row as Debezium's JsonConverter writes it."""
    out = {**row, "placed_at": int(row["placed_at"].timestamp()) * 10**6
           + row["placed_at"].microsecond,
           "updated_at": row["updated_at"].isoformat().replace("+00:00", "Z")}
    value, scale = unscaled(row["balance"])
    out["balance"] = {"scale": scale, "value": value}
    out["total"] = unscaled(row["total"].quantize(Decimal("0.01")))[0]
    return out


def event(op: str, row: dict, fields: list[dict] = FIELDS) -> tuple[bytes, bytes]:
    payload = {"before": None if op == "c" else image(row),
               "after": None if op == "d" else image(row), "op": op,
               "source": {"connector": "postgresql", "table": "accounts"}, "ts_ms": 0}
    key = {"schema": KEY_SCHEMA, "payload": {"id": row["id"]}}
    return (json.dumps(key).encode(),
            json.dumps({"schema": envelope(fields), "payload": payload}).encode())


def row(i: int, balance: str, **more) -> dict:
    return {"id": i, "name": f"a{i}", "balance": Decimal(balance),
            "total": Decimal(f"{i}0.5"), "placed_at": T0.replace(second=i),
            "updated_at": T0.replace(minute=i), **more}


def config(path: Path, name: str, topic: str, evolve: str = "add_columns",
           schemas_dir: Path | None = None) -> Path:
    registry = f'[schema_registry]\nschemas_dir = "{schemas_dir}"' if schemas_dir else ""
    path.write_text(f"""
[pipeline]
name = "{name}"
[kafka]
bootstrap_servers = "{BOOTSTRAP}"
topics = ["{topic}"]
timeout_seconds = 20
[database]
url = "{TEST_DB_URL}"
[sink]
format = "{'avro' if schemas_dir else 'json'}"
envelope = "debezium"
mode = "upsert"
table = "{name}"
columns = "schema"
evolve = "{evolve}"
{registry}
[spark]
master = "local[1]"
""")
    return path


def cli(*args) -> tuple[int, str]:
    r = cli_here(*args)
    return r.returncode, r.stdout + r.stderr


def columns_of(table: str) -> list[tuple[str, str, bool]]:
    """The record's columns: name, type as Postgres spells it, nullable."""
    return query("SELECT attname, format_type(atttypid, atttypmod), NOT attnotnull FROM "
                 "pg_attribute WHERE attrelid = %s::regclass AND attnum > 0 AND NOT "
                 "attisdropped AND attname NOT IN ('topic', 'partition', 'offset', "
                 "'kafka_timestamp', 'run_id', 'ingested_at', '_order_time') ORDER BY attnum",
                 (table,))


def rows_of(table: str) -> list[tuple]:
    extra = ", channel" if "channel" in [c[0] for c in columns_of(table)] else ""
    return query(f"SELECT id, name, balance::text, total::text, placed_at, updated_at{extra} "
                 f"FROM {table} ORDER BY id")


def test_init_db_makes_the_table_from_the_writers_schema_and_a_run_lands_it_exactly(
        tmp_path):
    name = unique("cols")
    topic = create_topic(name, 1)
    path = config(tmp_path / "p.toml", name, topic)
    # Balances of several scales, a trailing zero and more digits than a double holds.
    one, two, three = (row(1, "1.50"), row(2, "0.000001"),
                       row(3, "-12345678901234567890.123456789"))
    produce(topic, [event("c", one), event("c", two), event("c", three),
                    event("u", {**one, "balance": Decimal("7"), "name": None}),
                    event("d", two), (event("d", two)[0], None)])

    code, out = cli("init-db", "--config", path)
    assert code == EXIT_OK, out
    assert columns_of(name) == [
        ("id", "bigint", False), ("name", "text", True), ("balance", "numeric", True),
        ("total", "numeric(14,2)", False), ("placed_at", "timestamp with time zone", False),
        ("updated_at", "timestamp with time zone", True)]
    assert query("SELECT a.attname FROM pg_index i JOIN pg_attribute a ON a.attrelid = "
                 "i.indrelid AND a.attnum = ANY(i.indkey) WHERE i.indisprimary AND "
                 "i.indrelid = %s::regclass", (name,)) == [("id",)]

    code, out = cli("run", "--config", path)
    assert code == EXIT_OK, out
    assert rows_of(name) == [
        (1, None, "7", "10.50", one["placed_at"], one["updated_at"]),
        (3, "a3", "-12345678901234567890.123456789", "30.50", three["placed_at"],
         three["updated_at"])]

    # The source adds a column: its later events carry the field.
    four = row(4, "2.500", channel="web")
    produce(topic, [event("c", four, [*FIELDS, CHANNEL]),
                    event("u", {**three, "channel": "app"}, [*FIELDS, CHANNEL])])
    code, out = cli("run", "--config", config(path, name, topic, evolve="off"))
    assert code == EXIT_CONFIG, out
    assert (f'ALTER TABLE "public"."{name}" ADD COLUMN "channel" text\' or set sink.evolve = '
            "'add_columns'; nothing was read") in out
    code, out = cli("run", "--config", config(path, name, topic))
    assert code == EXIT_OK, out
    assert columns_of(name)[-1] == ("channel", "text", True)
    assert rows_of(name) == [
        (1, None, "7", "10.50", one["placed_at"], one["updated_at"], None),
        (3, "a3", "-12345678901234567890.123456789", "30.50", three["placed_at"],
         three["updated_at"], "app"),
        (4, "a4", "2.500", "40.50", four["placed_at"], four["updated_at"], "web")]

    # verify re-reads the topic with the table's columns, a balance's scale included.
    code, out = cli("verify", "--config", path)
    assert code == EXIT_OK, out
    query(f"UPDATE {name} SET balance = 2.5 WHERE id = 4 RETURNING id")
    code, out = cli("verify", "--config", path)
    assert code == EXIT_DATA, out
    assert "key (4): missing" in out  # 2.5 is not the 2.500 the source wrote


def test_a_topic_without_the_schema_envelope_is_one_exit_2_line_naming_topic_and_fix(
        tmp_path):
    name = unique("cols_plain")
    topic = create_topic(name, 1)
    payload = {"before": None, "after": {"id": 1, "name": "a"}, "op": "c"}
    produce(topic, [(json.dumps({"id": 1}).encode(), json.dumps(payload).encode())])
    code, out = cli("init-db", "--config", config(tmp_path / "p.toml", name, topic))
    assert code == EXIT_CONFIG, out
    [line] = [line for line in out.splitlines() if "writer schema" in line]
    assert (f"topic {name} has no writer schema for table {name} ({topic}[0] offset 0 is "
            "JSON without Kafka Connect's schema envelope {schema, payload}): columns = "
            "'schema' takes the columns from it - set the connector's "
            "value.converter.schemas.enable = true") in line
    assert "or declare the columns in [sink.columns] instead" in line


def test_an_avro_topics_writer_schema_by_its_id_makes_the_table(tmp_path):
    ns = "shop.public.accounts"
    vsd = {"type": "record", "name": "VariableScaleDecimal", "namespace": "io.debezium.data",
           "connect.name": "io.debezium.data.VariableScaleDecimal",
           "fields": [{"name": "scale", "type": "int"}, {"name": "value", "type": "bytes"}]}
    value = {"type": "record", "name": "Value", "namespace": ns, "fields": [
        {"name": "id", "type": "long"},
        {"name": "balance", "type": ["null", vsd], "default": None},
        {"name": "price", "type": ["null", PRICE], "default": None},
        {"name": "day", "type": {"type": "int", "connect.name": "io.debezium.time.Date"}}]}
    schemas = {21: envelope_schema(ns, value), 22: key_schema(ns)}
    for schema_id, schema in schemas.items():
        (tmp_path / f"{schema_id}.avsc").write_text(json.dumps(schema))
    name = unique("cols_avro")
    topic = create_topic(name, 1)

    def change(i: int, balance: str) -> tuple[bytes, bytes]:
        bytes_, scale = unscaled(Decimal(balance))
        after = {"id": i, "balance": {"scale": scale, "value": base64.b64decode(bytes_)},
                 "price": Decimal("9.90"), "day": 20000 + i}
        return (wire(22, schemas[22], {"id": i}), wire(21, schemas[21], {
            "before": None, "after": after, "source": SOURCE, "transaction": None,
            "op": "c", "ts_ms": 0}))

    produce(topic, [change(1, "0.10"), change(2, "123456789.000000001")])
    path = config(tmp_path / "p.toml", name, topic, schemas_dir=tmp_path)
    code, out = cli("init-db", "--config", path)
    assert code == EXIT_OK, out
    assert columns_of(name) == [("id", "bigint", False), ("balance", "numeric", True),
                                ("price", "numeric(10,2)", True), ("day", "date", False)]
    code, out = cli("run", "--config", path)
    assert code == EXIT_OK, out
    assert query(f"SELECT id, balance::text, price::text, day - DATE '1970-01-01' FROM {name} "
                 "ORDER BY id") == [(1, "0.10", "9.90", 20001),
                                    (2, "123456789.000000001", "9.90", 20002)]


def test_json_numbers_land_exact_in_a_decimal_and_rounded_in_a_decimal_p_s(tmp_path):
    """The decimal type outside Debezium: a plain JSON number, each with its own scale, beside
    a decimal(12,2) column that rounds as before."""
    name = unique("decimals")
    topic = create_topic(name, 1)
    produce(topic, [(None, b'{"id": 1, "exact": 1.50, "price": 1.005}'),
                    (None, b'{"id": 2, "exact": -12345678901234567890.123456789, '
                           b'"price": -2.345}'),
                    (None, b'{"id": 3, "exact": 0.000001, "price": 7}')])
    path = tmp_path / "p.toml"
    path.write_text(f"""
[pipeline]
name = "{name}"
[kafka]
bootstrap_servers = "{BOOTSTRAP}"
topics = ["{topic}"]
[database]
url = "{TEST_DB_URL}"
[sink]
format = "json"
table = "{name}"
[sink.columns]
id = "long not null"
exact = "decimal"
price = "decimal(12,2)"
[spark]
master = "local[1]"
""")
    for command in ("init-db", "run"):
        code, out = cli(command, "--config", path)
        assert code == EXIT_OK, out
    assert query(f"SELECT id, exact::text, price::text FROM {name} ORDER BY id") == [
        (1, "1.50", "1.01"), (2, "-12345678901234567890.123456789", "-2.35"),
        (3, "0.000001", "7.00")]


def test_a_keyless_topics_probe_gives_up_the_key_after_a_few_hundred_records(monkeypatch):
    """Events without a Kafka key (a source table without a primary key): the probe takes
    the columns from the newest event's schema and stops looking for a key schema after a
    few hundred records, instead of reading the whole range back on the driver."""
    from pipeline.driver import schema_probe
    from pipeline.plan.offsets import OffsetRange

    name = unique("keyless")
    topic = create_topic(name, 1)
    _, value = event("c", row(1, "1.5"))
    produce(topic, [(None, value)] * 5000)
    settings = make_settings(name, [topic], sink={"envelope": "debezium", "mode": "upsert",
                                                   "columns": "schema"})
    read: list = []
    real = schema_probe.batches

    def counted(*args, **kwargs):
        for batch in real(*args, **kwargs):
            read.extend(batch)
            yield batch

    monkeypatch.setattr(schema_probe, "batches", counted)
    writer = schema_probe.newest_writer(settings.sink, OffsetRange(topic, 0, 0, 5000),
                                        settings.kafka, None)
    assert writer is not None
    assert [c.name for c in writer.columns.columns][:2] == ["id", "name"]
    assert writer.columns.key == ()
    assert len(read) <= schema_probe.KEY_SEARCH, len(read)
