"""The column-type registry (pipeline/formats/types.py): one entry per declared type, which
config, the tables, Spark's schema and the JSON format all read."""

import pytest

from pipeline.config import COLUMN_TYPE, parse_settings
from pipeline.errors import ConfigError
from pipeline.formats import types
from pipeline.formats.types import column_type

DECLARED = [*types.TYPES, "decimal(12,2)", "decimal(38,0)", "decimal(2,2)"]


def test_a_decimal_is_parsed_once_into_its_entry():
    t = column_type("decimal(12,2)")
    assert (t.precision, t.scale, t.spark, t.pg, t.sum) == (
        12, 2, "decimal(12,2)", "numeric(12,2)", "decimal(38,2)")
    assert column_type("decimal(12,2)") is t
    assert not t.exact_json and column_type("decimal(16,2)").exact_json


@pytest.mark.parametrize("declared", DECLARED)
def test_every_declared_type_is_accepted_by_the_config_and_has_every_part(declared):
    m = COLUMN_TYPE.match(f"{declared} not null")
    assert m and m.group(1) == declared and m.group(4)
    t = column_type(declared)
    assert t.declared == declared and t.spark and t.pg and callable(t.from_json)
    assert t.sum is None or column_type(t.sum).sum == t.sum  # a sum's sum is itself


def test_the_spark_types_are_spark_sql_names():
    assert {d: column_type(d).spark for d in types.TYPES} == {
        "string": "string", "long": "bigint", "int": "int", "double": "double",
        "boolean": "boolean", "timestamp": "timestamp", "date": "date", "jsonb": "string",
        "decimal": "string"}  # no Spark decimal keeps each value's scale: no transform


def test_only_numbers_can_be_summed():
    assert {d for d in types.TYPES if column_type(d).sum} == {"long", "int", "double",
                                                               "decimal"}


def test_an_unknown_type_is_refused_with_the_spellings():
    for declared in ("varchar", "decimal(12)", "decimal(1,2,3)"):
        assert not COLUMN_TYPE.match(declared)
        with pytest.raises(KeyError, match="decimal\\(p,s\\)"):
            column_type(declared)
    doc = {"pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "h:9092", "topics": ["t"]},
           "database": {"url": "postgresql://u:pw@h/db"},
           "sink": {"format": "json", "table": "t", "columns": {"a": "varchar"}}}
    with pytest.raises(ConfigError, match="use string, long, int, double, boolean, timestamp, "
                                          "date, decimal, decimal\\(p,s\\), jsonb or array<T> "
                                          "\\(T one of these but jsonb\\), optionally"):
        parse_settings(doc)


@pytest.mark.parametrize("pg_type, form", [
    ("bytea", types.HEX), ("timestamp with time zone", types.TIMESTAMP),
    ("timestamptz NOT NULL", types.TIMESTAMP), ("text", types.ESCAPED),
    ("jsonb", types.ESCAPED), ("bigint", types.PLAIN), ("numeric(12,2)", types.PLAIN),
    ("date", types.PLAIN), ("boolean", types.PLAIN), ("double precision", types.PLAIN),
])
def test_how_spark_writes_each_postgres_type_as_copy_text(pg_type, form):
    assert types.copy_form(pg_type) == form


def test_every_declared_types_postgres_type_has_a_copy_form():
    forms = {d: types.copy_form(column_type(d).pg) for d in DECLARED}
    assert forms["string"] == types.ESCAPED and forms["timestamp"] == types.TIMESTAMP
    assert forms["jsonb"] == types.ESCAPED  # the JSON text
    assert {f for d, f in forms.items() if d not in ("string", "timestamp", "jsonb")} == {
        types.PLAIN}
