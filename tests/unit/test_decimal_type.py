"""The column type ``decimal``, a NUMERIC without precision: exact, any scale, each value
with its own scale; beside ``decimal(p,s)``, which rounds to its scale. Its rules in the
JSON and Avro formats, Debezium's decimals decoded into it, its COPY binary field, its sum,
and the settings that refuse it; no Kafka, no Postgres (tests/integration/test_decimal.py
stores it for real)."""

from __future__ import annotations

import base64
import json
import re
from decimal import Decimal

import pytest

from pipeline.config import COLUMN_TYPE, parse_settings
from pipeline.errors import ConfigError
from pipeline.formats import binary_fields
from pipeline.formats.encode import Encoder
from pipeline.formats.json.values import WrongType
from pipeline.formats.types import column_type
from pipeline.store import tables
from tests.unit.test_encode import Record

WIDE = "123456789012345678901234567890123456.78"  # 38 digits: beyond Decimal's 28


def test_decimal_is_a_numeric_without_precision_in_the_registry():
    t = column_type("decimal")
    assert (t.pg, t.sum, t.precision, t.scale) == ("numeric", "decimal", None, None)
    assert t.is_decimal and t.own_scale and t.scalar and t.exact_json
    assert not column_type("decimal(12,2)").own_scale
    assert column_type("array<decimal>").own_scale
    for declared in ("decimal", "decimal not null", "array<decimal>", "decimal(12,2)"):
        assert COLUMN_TYPE.match(declared)
    assert tables.ddl_type(tables.sink_type("decimal")) == "numeric"
    assert tables.ddl_type(tables.sink_type("array<decimal>")) == "numeric[]"


@pytest.mark.parametrize("value, text", [
    (Decimal("1.50"), "1.50"), (Decimal("-0.00"), "-0.00"), (7, "7"), (-7, "-7"),
    (0.1, "0.1"), ("0.000000150", "0.000000150"), (" 12.5 ", "12.5"),
    (Decimal("1E+2"), "100"), (Decimal("1.50E-7"), "0.000000150"), (Decimal(WIDE), WIDE),
    (10**40, "1" + "0" * 40),
])
def test_a_value_keeps_its_digits_and_scale(value, text):
    assert column_type("decimal").from_json(value) == text
    if not isinstance(value, str):
        assert column_type("decimal").from_avro(value) == text


@pytest.mark.parametrize("value", [
    "abc", "", True, None, [1], {"a": 1}, "NaN", Decimal("NaN"), Decimal("Infinity"),
    float("inf"), Decimal("1E+131072"), Decimal("1E-16384")])
def test_what_is_no_number_or_beyond_a_numeric_is_a_wrong_type(value):
    with pytest.raises(WrongType):
        column_type("decimal").from_json(value)


def test_avro_takes_no_numeric_strings():
    with pytest.raises(WrongType):
        column_type("decimal").from_avro("1.5")


def test_a_json_record_with_a_decimal_column_is_parsed_exactly():
    columns = (("id", "long", True), ("amount", "decimal", False),
               ("rounded", "decimal(4,1)", False))
    out = Encoder("json", columns, 1).encode("t", 0, [
        Record(0, b'{"id": 1, "amount": 1234567890.12345678901234567890, "rounded": 1.25}'),
        Record(1, b'{"id": 2, "amount": 1.50, "rounded": "1.50"}'),
        Record(2, b'{"id": 3, "amount": 1e200000}'),
    ])
    assert [r.split("\t")[4:7] for r in out.rows] == [
        ["1", "1234567890.12345678901234567890", "1.3"], ["2", "1.50", "1.5"]]
    assert [d.split("\t")[7] for d in out.dead] == ["wrong_type"]


def vsd(unscaled: int, scale: int) -> dict:
    n = (unscaled.bit_length() + 8) // 8
    return {"scale": scale, "value": base64.b64encode(unscaled.to_bytes(n, "big",
                                                                      signed=True)).decode()}


def connect_decimal(unscaled: int) -> str:
    n = (unscaled.bit_length() + 8) // 8
    return base64.b64encode(unscaled.to_bytes(n, "big", signed=True)).decode()


def debezium(after: dict, fields: list[dict]) -> bytes:
    schema = {"type": "struct", "fields": [
        {"field": "after", "type": "struct", "optional": True, "fields": fields},
        {"field": "op", "type": "string"}]}
    return json.dumps({"schema": schema, "payload": {"op": "c", "after": after}}).encode()


VSD_FIELD = {"field": "balance", "type": "struct",
             "name": "io.debezium.data.VariableScaleDecimal",
             "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}]}


def test_debeziums_decimals_land_exact_in_decimal_and_rounded_in_decimal_p_s():
    fields = [{"field": "id", "type": "int64"}, VSD_FIELD,
              {"field": "total", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
               "parameters": {"scale": "4"}}]  # no connect.decimal.precision
    values = [({"id": 1, "balance": vsd(13353520, 3), "total": connect_decimal(-15000)},
               ["13353.520", "-1.5000"]),
              ({"id": 2, "balance": vsd(-5, 7), "total": connect_decimal(10**40 + 1)},
               ["-0.0000005", "1000000000000000000000000000000000000.0001"])]
    records = [Record(i, debezium(after, fields), k=b"1") for i, (after, _) in enumerate(values)]
    exact = Encoder("debezium", (("id", "long", True), ("balance", "decimal", True),
                                 ("total", "decimal", True)), 1, tombstone_key=("id",))
    rounded = Encoder("debezium", (("id", "long", True), ("balance", "decimal(20,2)", True),
                                   ("total", "decimal(60,2)", True)), 1, tombstone_key=("id",))
    assert [r.split("\t")[5:7] for r in exact.encode("t", 0, records).rows] == [
        want for _, want in values]
    assert [r.split("\t")[5:7] for r in rounded.encode("t", 0, records).rows] == [
        ["13353.52", "-1.50"], ["-0.00", "1000000000000000000000000000000000000.00"]]


def test_a_connect_decimal_of_38_digits_is_not_rounded_to_28():
    # Seen failing before the fix: Decimal.scaleb rounded the unscaled value to 28 digits
    # (123456789012345678901234567900000000.00).
    fields = [{"field": "id", "type": "int64"},
              {"field": "total", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
               "parameters": {"scale": "2", "connect.decimal.precision": "38"}}]
    record = Record(0, debezium({"id": 1, "total": connect_decimal(int(WIDE.replace(".", "")))},
                                fields), k=b"1")
    out = Encoder("debezium", (("id", "long", True), ("total", "decimal(38,2)", True)), 1,
                  tombstone_key=("id",)).encode("t", 0, [record])
    assert [r.split("\t")[5] for r in out.rows] == [WIDE]


def test_the_binary_field_of_a_38_digit_decimal_is_exact():
    # Seen failing before the fix: the text -> binary conversion scaled by Decimal.scaleb.
    field = binary_fields.from_text("decimal(38,2)")
    unscaled = int(WIDE.replace(".", ""))
    assert field(WIDE) == field(f"{unscaled}e-2") == binary_fields.numeric_field(unscaled, 2)


@pytest.mark.parametrize("text, unscaled, scale", [
    ("1.50", 150, 2), ("-0.000000150", -150, 9), ("100", 100, 0), ("0", 0, 0),
    (WIDE, int(WIDE.replace(".", "")), 2), ("1" + "0" * 300 + ".5", 10**301 + 5, 1)])
def test_a_decimals_binary_field_has_the_values_own_scale(text, unscaled, scale):
    assert binary_fields.from_text("decimal")(text) == binary_fields.numeric_field(
        unscaled, scale)
    assert binary_fields.binary_types(["decimal", "array<decimal>"]) is False
    assert binary_fields.binary_types(["decimal", "long"]) is True


def settings(**sink):
    return parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "h:9092", "topics": ["t"]},
        "database": {"url": "postgresql://u:pw@h/db"},
        "sink": {"format": "json", "table": "t", **sink}}, environ={})


def test_a_sum_of_decimals_is_a_decimal_and_a_decimal_can_be_a_key():
    s = settings(mode="aggregate", group_by=["k"], aggregates={"total": "sum(amount)",
                                                               "top": "max(amount)"},
                 columns={"k": "decimal", "amount": "decimal"}).sink
    declared = {c.name: c for c in s.columns}
    assert [tables.ddl_type(tables.aggregate_type(a, declared)) for a in s.aggregates] == [
        "numeric", "numeric"]
    assert settings(mode="upsert", key=["k"], columns={"k": "decimal not null"}).sink.key == (
        "k",)


def test_a_decimal_column_is_refused_under_a_transform_naming_it():
    with pytest.raises(ConfigError, match="'sink.columns.balance' \\(decimal\\) is not "
                                          "supported with 'sink.transform'.*decimal\\(p,s\\)"):
        settings(transform="m:f", columns={"id": "long", "balance": "decimal"})


def test_verify_compares_a_decimals_scale_and_a_sums_but_not_a_maxs():
    from pipeline.sinks import for_settings

    upsert = for_settings(settings(mode="upsert", key=["id"], columns={
        "id": "long", "balance": "decimal", "total": "decimal(12,2)"}))
    assert upsert.state_scaled() == {"balance"}
    aggregate = for_settings(settings(mode="aggregate", group_by=["k"], aggregates={
        "total": "sum(amount)", "top": "max(amount)"}, columns={"k": "long",
                                                                 "amount": "decimal"}))
    assert aggregate.state_scaled() == {"total"}


@pytest.mark.parametrize("declared, value", [
    ("decimal(10,2)", "123.45"), ("decimal(10,2)", "-0.00"), ("decimal(2,2)", "0.05"),
    ("decimal(2,2)", "-0.99"), ("decimal(4,2)", "123.45"), ("decimal(4,2)", "99.99"),
    ("decimal(10,2)", "12345678.90"), ("decimal(10,2)", "123456789.00"),
    ("decimal(10,2)", "1.5"), ("decimal(10,2)", "1.505"), ("decimal(10,2)", "1E+2"),
    ("decimal(12,8)", "0.00000001"), ("decimal(38,10)", "1234567890123456789.0123456789")])
def test_a_decimal_of_the_columns_scale_is_written_as_its_text_is(declared, value):
    # Debezium's decimals arrive as Decimals of the column's scale: written as they are,
    # with the same size check, the same text and error as the value written as text.
    from pipeline.formats.json.values import OutOfRange

    convert = column_type(declared).from_json
    try:
        want = convert(value)
    except OutOfRange as e:
        with pytest.raises(OutOfRange, match=re.escape(str(e).split(" is too")[1])):
            convert(Decimal(value))
        return
    assert convert(Decimal(value)) == want
