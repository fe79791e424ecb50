"""pipeline/store/tables.py against what the executors write: the COPY column lists the driver
derives from the Table definitions must match the fields of the lines encode.py makes."""

import struct

from pipeline import sinks
from pipeline.config import Column, SinkSettings
from pipeline.store import tables
from tests.unit.test_encode import COLUMNS, Record

SINK = SinkSettings("json", "orders", columns=tuple(Column(n, t, r) for n, t, r in COLUMNS))


def results(sink: SinkSettings):
    return sinks.for_sink(sink, "public", "p").results


def test_a_json_row_has_one_field_per_written_column_in_table_order():
    from pipeline.formats.encode import Encoder

    rows, _, _ = Encoder("json", COLUMNS, 42).encode("orders", 3, [Record(
        17, b'{"order_id": 1, "customer": "c", "amount": 2.5}')])
    written = [c.name for c in tables.written(results(SINK))]
    assert written == ["topic", "partition", "offset", "kafka_timestamp", "order_id",
                       "customer", "amount", "placed_at", "run_id"]
    assert len(rows[0].rstrip("\n").split("\t")) == len(written)


def test_a_raw_row_is_one_binary_tuple_of_the_written_columns():
    from pipeline.formats.encode import Encoder

    rows, _, _ = Encoder("raw", (), 42).encode("orders", 3, [Record(17, b"v", k=b"k")])
    written = tables.written(results(SinkSettings("raw", "raw_orders")))
    assert [c.name for c in written] == ["topic", "partition", "offset", "key", "value",
                                         "headers", "kafka_timestamp", "run_id"]
    assert struct.unpack(">h", rows[0][:2])[0] == len(written)  # COPY binary field count


def test_a_dead_letter_line_has_one_field_per_dead_letter_field():
    from pipeline.formats.encode import Encoder

    _, dead, _ = Encoder("json", COLUMNS, 1).encode("orders", 3, [Record(5, b"{not json")])
    assert [c.name for c in tables.DEAD_LETTER_FIELDS] == [
        "topic", "partition", "offset", "key", "value", "headers", "kafka_timestamp",
        "error_type", "error_message"]
    assert len(dead[0].rstrip("\n").split("\t")) == len(tables.DEAD_LETTER_FIELDS)


def test_the_results_table_takes_the_declared_types_and_nullability():
    table = results(SINK)
    assert tables.typed(tables.from_record(table))[3:] == [
        ("kafka_timestamp", "timestamp with time zone"), ("order_id", "bigint"),
        ("customer", "text"), ("amount", "numeric(12,2)"),
        ("placed_at", "timestamp with time zone")]
    assert [c.name for c in table.columns if not c.nullable] == [
        "topic", "partition", "offset", "order_id", "customer", "run_id", "ingested_at"]
    assert [c.name for c in table.primary_key] == ["topic", "partition", "offset"]


def test_the_executors_import_no_sqlalchemy():
    """They get the staging COPY as a string (Run.staging_copy): importing SQLAlchemy in
    every Python worker would cost a quarter of a second each. Nor does the run module
    (pipeline.store.run: the staging table's name)."""
    import subprocess
    import sys

    code = ("import sys, pipeline.executor.stage, pipeline.formats.encode, "
            "pipeline.executor.consume, pipeline.formats.json.diagnose, "
            "pipeline.formats.types, pipeline.store.run;"
            "print(any(m.startswith('sqlalchemy') for m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.strip()
    assert out == "False"


def test_each_declared_type_gets_the_registrys_postgres_type():
    from pipeline.formats import types

    for declared in [*types.TYPES, "decimal(12,2)", "decimal(38,0)"]:
        assert tables.ddl_type(tables.sink_type(declared)) == types.column_type(declared).pg


def test_a_declared_column_named_like_a_defaulted_one_is_written():
    # Before, written() dropped any column called updated_at or deleted_at by its name:
    # a CDC table's updated_at was missing from the COPY list (exit 1, extra data).
    sink = SinkSettings("json", "t", columns=(Column("updated_at", "timestamp", False),
                                              Column("deleted_at", "timestamp", False)))
    assert [c.name for c in tables.written(results(sink))] == [
        "topic", "partition", "offset", "kafka_timestamp", "updated_at", "deleted_at",
        "run_id"]
