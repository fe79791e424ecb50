"""[sink] evolve: its config rules, and which missing columns a run may add (pure)."""

import pytest

from pipeline.config import parse_settings
from pipeline.errors import ConfigError
from pipeline.store import tables
from pipeline.store.evolve import Addition, additions

JSON = {"format": "json", "table": "orders",
        "columns": {"order_id": "long not null", "channel": "string", "code": "string not null"}}


def settings(**sink):
    return parse_settings({
        "pipeline": {"name": "p1"},
        "kafka": {"bootstrap_servers": "h:9092", "topics": ["t"]},
        "database": {"url": "postgresql://u:pw@h/db"},
        "sink": {**JSON, **sink}}, environ={})


def test_evolve_is_off_unless_asked():
    assert settings().sink.evolve == "off"
    assert settings(evolve="off").sink.evolve == "off"
    assert settings(evolve="add_columns").sink.evolve == "add_columns"
    assert settings(evolve="add_columns", mode="upsert",
                    key=["order_id"]).sink.evolve == "add_columns"


@pytest.mark.parametrize("sink, message", [
    ({"evolve": "yes"}, "'sink.evolve' = 'yes': must be one of off, add_columns"),
    ({"evolve": True}, "'sink.evolve' must be a string, got a boolean"),
    ({"evolve": "add_columns", "mode": "aggregate", "group_by": ["channel"],
      "aggregates": {"n": "count(*)"}}, "is refused for sink.mode = 'aggregate'"),
    ({"evolve": "add_columns", "format": "raw", "columns": {}},
     "it is for sink.format = 'json', 'avro' or 'protobuf'"),
])
def test_a_bad_evolve_is_one_line_error(sink, message):
    with pytest.raises(ConfigError) as e:
        settings(**sink)
    assert message in e.value.message and "\n" not in e.value.message


def test_only_declared_columns_the_table_lacks_are_added():
    sink = settings(evolve="add_columns").sink
    rows = tables.record_rows(sink, "orders")
    have = {"topic", "partition", "offset", "kafka_timestamp", "order_id", "ingested_at"}
    # run_id is missing too, but it is no [sink.columns] column: damage, left to the error.
    assert additions(rows, have, sink) == [Addition("orders", "channel", "text", False),
                                           Addition("orders", "code", "text", True)]
    assert str(additions(rows, have, sink)[1]) == "code text NOT NULL"
    assert additions(rows, have | {"channel", "code"}, sink) == []
    assert additions(rows, set(), sink) == []  # no table: init-db's error, not evolve's
    off = settings().sink
    assert additions(rows, have, off) == []
