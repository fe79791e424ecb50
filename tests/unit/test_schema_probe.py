"""[sink] columns = "schema": the settings that say so; the run's union of the writers'
columns with the table's (driver/writer_columns.py): new fields, columns the source
dropped, conflicts named with their fix; and a topic without a writer schema told from a
bad record (driver/schema_probe.py). No Kafka, no Postgres."""

from __future__ import annotations

from dataclasses import replace

import pytest

from pipeline.config import parse_settings
from pipeline.driver.schema_probe import _no_schema, _schemaless
from pipeline.driver.writer_columns import Writer, with_writer_columns
from pipeline.errors import ConfigError
from pipeline.formats.debezium.schema_columns import SchemaColumn, WriterColumns
from pipeline.settings import Column
from pipeline.store.schema import LiveTable
from pipeline.store.tables import declared_type
from tests.unit.test_schema_columns import CAPTURED_JSON, json_columns


def settings(**sink):
    return parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "h:9092",
                                              "topics": ["shop.public.orders"]},
        "database": {"url": "postgresql://u:pw@h/db"},
        "sink": {"format": "json", "table": "orders", "envelope": "debezium",
                 "mode": "upsert", "columns": "schema", **sink}}, environ={})


def test_columns_schema_is_a_debezium_upsert_whose_columns_the_run_fills_in():
    s = settings(evolve="add_columns", truncate="apply").sink
    assert (s.columns_from_schema, s.columns, s.key, s.mode, s.deletes, s.evolve,
            s.truncate) == (True, (), (), "upsert", True, "add_columns", "apply")
    assert not parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "h:9092", "topics": ["t"]},
        "database": {"url": "postgresql://u:pw@h/db"},
        "sink": {"format": "json", "table": "t", "columns": {"id": "long"}}},
        environ={}).sink.columns_from_schema


@pytest.mark.parametrize("sink, why", [
    ({"envelope": "none"}, "needs sink.envelope = 'debezium'"),
    ({"mode": "append"}, "sink.mode = 'upsert'"),
    ({"format": "raw"}, "sink.format = 'json'"),
    ({"key": ["id"]}, "'sink.key' is not for sink.columns = 'schema' \\(the key is the Kafka "
                      "key's fields\\)"),
    ({"tombstones": "dead_letter"}, "needs sink.tombstones = 'delete'"),
    ({"columns": "scheme"}, "'sink.columns' = 'scheme': write a table of columns"),
])
def test_what_columns_schema_cannot_be_is_refused_naming_the_fix(sink, why):
    with pytest.raises(ConfigError, match=why):
        settings(**sink)


def C(name: str, type_: str, required: bool = True) -> SchemaColumn:
    return SchemaColumn(name, type_, required)


ORDERS = WriterColumns((C("id", "long"), C("status", "string"), C("total", "decimal(14,2)"),
                        C("placed_at", "timestamp")), ("id",))
WITH_CHANNEL = WriterColumns((*ORDERS.columns, C("channel", "string", False)), ("id",))
SINK = settings().sink


def writer(columns: WriterColumns, offset: int = 9) -> Writer:
    return Writer(columns, f"shop.public.orders[0] offset {offset}")


def live(**columns: tuple[str, bool]) -> LiveTable:
    fixed = {"topic": ("text", False), "partition": ("integer", False),
             "offset": ("bigint", False), "kafka_timestamp": ("timestamp with time zone", True),
             "run_id": ("bigint", False), "ingested_at": ("timestamp with time zone", False),
             "_order_time": ("timestamp with time zone", True)}
    return LiveTable("orders", {**fixed, **columns}, ("id",))


def resolved(writers, table=None, sink=SINK) -> list[tuple]:
    s = with_writer_columns(sink, "shop.public.orders", writers, table)
    return [(c.name, c.type, c.required) for c in s.columns], s.key


def test_a_new_table_takes_the_writers_columns_and_key():
    assert resolved([writer(ORDERS)]) == ([
        ("id", "long", True), ("status", "string", True), ("total", "decimal(14,2)", True),
        ("placed_at", "timestamp", True)], ("id",))


def test_the_real_captured_schema_resolves_to_the_replicas_columns():
    columns = json_columns(CAPTURED_JSON["shop_json.public.order_lines"][-1])
    cols, key = resolved([writer(columns)])
    assert key == ("order_id", "line_no")
    assert cols[:2] == [("order_id", "long", True), ("line_no", "int", True)]


ORDERS_TABLE = live(id=("bigint", False), status=("text", False),
                    total=("numeric(14,2)", False), placed_at=("timestamp with time zone", False))


def test_a_field_the_table_lacks_is_a_nullable_column_and_one_it_no_longer_sends_stays():
    # The source added channel (NOT NULL there, say) and dropped status.
    writers = [writer(WriterColumns((C("id", "long"), C("total", "decimal(14,2)"),
                                     C("placed_at", "timestamp"), C("channel", "string")),
                                    ("id",)))]
    cols, key = resolved(writers, ORDERS_TABLE)
    assert cols == [("id", "long", True), ("total", "decimal(14,2)", True),
                    ("placed_at", "timestamp", True), ("channel", "string", False),
                    ("status", "string", False)]
    assert key == ("id",)


def test_columns_of_types_the_pipeline_does_not_write_are_left_to_the_table():
    table = live(**ORDERS_TABLE.columns, note=("uuid", True))
    cols, _ = resolved([writer(ORDERS)], table)
    assert "note" not in [c[0] for c in cols]


def test_a_type_that_differs_from_the_tables_names_both_and_the_alter():
    table = live(**{**ORDERS_TABLE.columns, "total": ("numeric(12,2)", False)})
    with pytest.raises(ConfigError) as e:
        resolved([writer(ORDERS)], table)
    assert e.value.message == (
        "table orders: column total is numeric(12,2), the writer's schema of topic "
        "shop.public.orders says decimal(14,2) (numeric(14,2)) in shop.public.orders[0] offset "
        "9: run 'ALTER TABLE orders ALTER COLUMN total TYPE numeric(14,2)' as the table's owner "
        "(or point sink.table at a new table); nothing was read")


def test_two_writers_of_one_table_are_united_and_a_field_typed_twice_is_refused():
    cols, _ = resolved([writer(ORDERS, 3), writer(WITH_CHANNEL, 9)])
    assert [c[0] for c in cols] == ["id", "status", "total", "placed_at", "channel"]
    other = WriterColumns((C("id", "long"), C("total", "double")), ("id",))
    with pytest.raises(ConfigError, match="field 'total' is double in shop.public.orders\\[0\\] "
                                          "offset 4 and decimal\\(14,2\\) in .*offset 3"):
        resolved([writer(ORDERS, 3), writer(other, 4)])


def test_columns_another_topic_resolved_are_kept():
    earlier = with_writer_columns(SINK, "a", [writer(WITH_CHANNEL)], None)
    cols, _ = resolved([writer(ORDERS)], None, earlier)
    assert ("channel", "string", False) in cols


def test_the_key_comes_from_the_kafka_key_else_from_the_table():
    no_key = WriterColumns(ORDERS.columns, ())  # a truncate's: no Kafka key
    assert resolved([writer(no_key)], ORDERS_TABLE)[1] == ("id",)
    with pytest.raises(ConfigError, match="no Kafka key with a schema \\(a source table "
                                          "without a primary key\\?\\)"):
        resolved([writer(no_key)])
    changed = WriterColumns(ORDERS.columns, ("status",))
    with pytest.raises(ConfigError, match="the Kafka keys name different key columns"):
        resolved([writer(ORDERS, 1), writer(changed, 2)])


@pytest.mark.parametrize("name, why", [
    ("offset", "'column offset' is reserved"),
    ("Total", "'column Total' = 'Total' is not a safe SQL identifier"),
    ("_order_time", "'column _order_time' is reserved for an upsert sink"),
])
def test_a_field_name_the_table_cannot_take_is_refused_naming_the_override(name, why):
    columns = WriterColumns((C("id", "long"), C(name, "string")), ("id",))
    with pytest.raises(ConfigError) as e:
        resolved([writer(columns)])
    assert why in e.value.message
    assert e.value.message.startswith("table orders, topic shop.public.orders: the writer's "
                                      "schema cannot be the table's columns as it is")
    assert e.value.message.endswith("declare the table's columns for the topic (with from = "
                                    "\"<field>\" for a name to change) instead of columns = "
                                    "'schema'")


def test_a_double_key_is_refused_as_a_declared_one_is():
    columns = WriterColumns((C("id", "double"),), ("id",))
    with pytest.raises(ConfigError, match="floating-point keys"):
        resolved([writer(columns)])


def test_no_writer_and_no_table_says_so():
    with pytest.raises(ConfigError, match="no record of topic shop.public.orders's planned "
                                          "ranges carries a writer schema"):
        resolved([], None, SINK)


@pytest.mark.parametrize("ddl, declared", [
    ("text", "string"), ("bigint", "long"), ("integer", "int"),
    ("double precision", "double"), ("boolean", "boolean"),
    ("timestamp with time zone", "timestamp"), ("date", "date"), ("jsonb", "jsonb"),
    ("numeric", "decimal"), ("numeric(14,2)", "decimal(14,2)"), ("text[]", "array<string>"),
    ("numeric(10,2)[]", "array<decimal(10,2)>"), ("numeric[]", "array<decimal>"),
    ("numeric(120,2)", None), ("uuid", None), ("jsonb[]", None),
    ("timestamp without time zone", None)])
def test_a_live_columns_type_maps_back_to_its_declared_type(ddl, declared):
    assert declared_type(ddl) == declared


def test_resolved_settings_are_a_declared_upsert_of_those_columns():
    s = with_writer_columns(SINK, "t", [writer(ORDERS)], None)
    assert s.columns[0] == Column("id", "long", True) and s.key == ("id",)
    assert s.columns_from_schema and s.deletes


class Message:
    """A consumed record as confluent-kafka gives it (what the probe reads of one)."""

    def __init__(self, value: bytes, offset: int = 5):
        self._value, self._offset = value, offset

    def topic(self) -> str:
        return "shop.public.orders"

    def partition(self) -> int:
        return 0

    def offset(self) -> int:
        return self._offset

    def value(self) -> bytes:
        return self._value


@pytest.mark.parametrize("fmt, value, what", [
    ("json", b'{"before": null, "after": {"id": 1}, "op": "c"}',
     "shop.public.orders[0] offset 5 is JSON without Kafka Connect's schema envelope"),
    ("json", b"not json", None),  # a bad record: a dead letter of the run, not the topic's
    ("json", b'{"schema": {"type": "struct"}, "payload": {}}', None),
    ("avro", b'{"id": 1}', "shop.public.orders[0] offset 5 is not in the Confluent wire "
                           "format (no writer schema id)"),
    ("avro", b"\x00\x00\x00\x00\x07rest", None),
])
def test_a_record_without_a_writer_schema_is_told_from_a_bad_one(fmt, value, what):
    found = _schemaless(replace(SINK, format=fmt), Message(value))
    assert found == (what and f"{what}{' {schema, payload}' if fmt == 'json' else ''}")


def test_a_topic_without_a_writer_schema_names_the_topic_and_the_converter_setting():
    assert _no_schema(SINK, "shop.public.orders", "shop.public.orders[0] offset 5 is JSON") == (
        "topic shop.public.orders has no writer schema for table orders (shop.public.orders[0] "
        "offset 5 is JSON): columns = 'schema' takes the columns from it - set the "
        "connector's value.converter.schemas.enable = true (and key.converter's), or declare "
        "the columns in [sink.columns] instead; nothing was read")
    assert "Confluent's AvroConverter" in _no_schema(replace(SINK, format="avro"), "t", "x")
