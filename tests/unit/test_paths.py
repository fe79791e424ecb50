"""[sink.columns] field paths and names (``from``) and the jsonb and array<T> column types:
the path syntax, the config's one-line errors, and what the JSON and Avro formats make of
records, rows and dead letters alike, without Kafka or Spark."""

import json

import fastavro
import pytest

from pipeline.config import parse_settings
from pipeline.errors import ConfigError
from pipeline.formats import paths
from pipeline.formats.encode import Encoder
from pipeline.formats.schema_source import SchemaSource
from pipeline.formats.types import column_type
from tests.unit.test_avro import wire
from tests.unit.test_encode import Record


@pytest.mark.parametrize("text, path", [
    ("id", ("id",)), ("orderId", ("orderId",)), ("customer.id", ("customer", "id")),
    ("a.b.c", ("a", "b", "c")), ("`a.b`.c", ("a.b", "c")), ("x.`we``ird`", ("x", "we`ird")),
    ("`spaced key`", ("spaced key",)), ("héllo.wörld", ("héllo", "wörld")),
])
def test_a_path_is_keys_separated_by_dots_a_dotted_key_in_backticks(text, path):
    assert paths.parse(text) == path
    assert paths.parse(paths.label(path)) == path


@pytest.mark.parametrize("text, why", [
    ("", "is empty"), ("a..b", "empty key"), (".a", "empty key"), ("a.", "empty key"),
    ("`a", "not closed"), ("a`b", "backtick inside a key"), ("`a`b", "text after a quoted"),
    (5, "not a string"),
])
def test_a_bad_path_says_why(text, why):
    with pytest.raises(paths.BadPath, match=why):
        paths.parse(text)


def test_lookup_treats_absent_and_null_alike_and_names_a_non_object_on_the_way():
    doc = {"c": {"id": 7, "none": None}, "s": "text", "n": None}
    assert paths.lookup(doc, ("c", "id")) == 7
    assert paths.lookup(doc, ("c", "gone")) is None
    assert paths.lookup(doc, ("n", "id")) is None
    assert paths.lookup(doc, ("gone", "id")) is None
    with pytest.raises(paths.NotAnObject) as e:
        paths.lookup(doc, ("s", "id"))
    assert e.value.where == ("s",) and e.value.value == "text"


# ---- config --------------------------------------------------------------------------------
def settings(columns: dict, **sink):
    return parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "h:9092", "topics": ["t"]},
        "database": {"url": "postgresql://u:pw@h/db"},
        "sink": {"format": "json", "table": "t", "columns": columns, **sink}}, environ={})


def test_the_long_form_names_a_source_path_and_the_short_form_is_unchanged():
    s = settings({"customer_id": {"type": "long not null", "from": "customer.id"},
                  "order_id": {"type": "long", "from": "orderId"},
                  "status": "string", "note": {"type": "string", "from": "note"},
                  "tags": "array<string>", "raw": {"type": "jsonb"}})
    got = {c.name: (c.type, c.required, c.source) for c in s.sink.columns}
    assert got == {"customer_id": ("long", True, ("customer", "id")),
                   "order_id": ("long", False, ("orderId",)), "status": ("string", False, ()),
                   "note": ("string", False, ()), "tags": ("array<string>", False, ()),
                   "raw": ("jsonb", False, ())}


@pytest.mark.parametrize("spec, message", [
    ({"type": "long", "from": "a..b"}, "'sink.columns.c.from' = 'a..b' has an empty key"),
    ({"type": "long", "from": ""}, "'sink.columns.c.from' = '' is empty"),
    ({"type": "long", "path": "a"}, "'sink.columns.c' = .*keys type and from only"),
    ({"from": "a"}, "'sink.columns.c' = .*keys type and from only"),
    ({"type": "varchar", "from": "a"}, "'sink.columns.c' = 'varchar': use string"),
    ("array<jsonb>", "'sink.columns.c' = 'array<jsonb>': use"),
    ("array<array<long>>", "'sink.columns.c' = 'array<array<long>>': use"),
])
def test_a_bad_column_entry_is_a_one_line_error_naming_the_key(spec, message):
    with pytest.raises(ConfigError, match=message) as e:
        settings({"c": spec})
    assert "\n" not in str(e.value)


def test_keys_groups_and_min_max_refuse_jsonb_and_arrays_and_a_transform_takes_paths():
    with pytest.raises(ConfigError, match="'sink.key' column 'doc' is a jsonb: a key holds"):
        settings({"doc": "jsonb"}, mode="upsert", key=["doc"])
    with pytest.raises(ConfigError, match="'sink.group_by' column 'ids' is a array<long>"):
        settings({"ids": "array<long>"}, mode="aggregate", group_by=["ids"],
                 aggregates={"n": "count(*)"})
    with pytest.raises(ConfigError, match=r"'sink.aggregates.m': max\(\) of a jsonb"):
        settings({"g": "string", "doc": "jsonb"}, mode="aggregate", group_by=["g"],
                 aggregates={"m": "max(doc)"})
    # A transform's input is the Encoder's rows: a path reads as on the built-in path.
    assert settings({"c": {"type": "long", "from": "a.b"}}, transform="m:f").sink.columns[
        0].source == ("a", "b")
    with pytest.raises(ConfigError, match="'sink.columns.c' \\(jsonb\\) is not supported"):
        settings({"c": "jsonb"}, transform="m:f")
    # An upsert key may come from a path.
    s = settings({"id": {"type": "long", "from": "after.id"}}, mode="upsert", key=["id"])
    assert s.sink.columns[0].required and s.sink.columns[0].source == ("after", "id")


# ---- JSON -----------------------------------------------------------------------------------
COLUMNS = (("order_id", "long", True, ("orderId",)),
           ("customer_id", "long", False, ("customer", "id")),
           ("city", "string", False, ("customer", "address", "city")),
           ("doc", "jsonb", False, ("customer",)),
           ("tags", "array<string>", False, ()),
           ("qty", "array<long>", False, ("lines", "qty")))


def encode(values, columns=COLUMNS, fmt="json", **kw):
    records = [Record(i, v if v is None or type(v) is bytes else json.dumps(v).encode())
               for i, v in enumerate(values)]
    return Encoder(fmt, columns, 1, **kw).encode("t", 0, records)


def fields(line: str) -> list[str]:
    return line.rstrip("\n").split("\t")[4:-1]


def dead(encoded) -> dict[int, tuple[str, str]]:
    return {int(f[2]): (f[7], f[8].rstrip("\n")) for f in (d.split("\t") for d in encoded.dead)}


def test_json_columns_read_nested_paths_any_spelling_subdocuments_and_arrays():
    encoded = encode([
        {"orderId": 1, "customer": {"id": 7, "address": {"city": "Zürich"}},
         "tags": ["a\"b", "c\\d", None, "t\tab"], "lines": {"qty": [1, 2, None]}},
        {"orderId": 2},  # every optional path absent
        {"orderId": 3, "customer": None, "lines": {}},  # null on the way: absent too
    ])
    assert encoded.dead == []
    assert [fields(line) for line in encoded.rows] == [
        ["1", "7", "Zürich", '{"id":7,"address":{"city":"Zürich"}}',
         '{"a\\\\"b","c\\\\\\\\d",NULL,"t\\tab"}', '{"1","2",NULL}'],
        ["2", "\\N", "\\N", "\\N", "\\N", "\\N"],
        ["3", "\\N", "\\N", "\\N", "\\N", "\\N"]]


def test_json_dead_letters_name_the_path_the_column_and_a_wrong_element():
    encoded = encode([
        {"customer": {"id": 7}},  # the required orderId is absent
        {"orderId": 1, "customer": {"id": "7"}},
        {"orderId": 1, "customer": "Ann"},
        {"orderId": 1, "lines": {"qty": [1, "two"]}},
        {"orderId": 1, "tags": "a"},
        {"orderId": 1, "customer": {"address": {"city": 5}}},
        {"orderId": 1, "customer": {"x": "nul\u0000"}},
    ])
    assert encoded.rows == []
    assert dead(encoded) == {
        0: ("missing_field", "required field 'orderId' (column order_id) is missing or null"),
        1: ("wrong_type", "field 'customer.id' (column customer_id): expected long, got "
                          "string"),
        2: ("wrong_type", "field 'customer.id' (column customer_id): 'customer' is JSON "
                          "string, not an object"),
        3: ("wrong_type", "field 'lines.qty' (column qty): expected array<long>, got array: "
                          "element [1] is string"),
        4: ("wrong_type", "field 'tags': expected array<string>, got string"),
        5: ("wrong_type", "field 'customer.address.city' (column city): expected string, "
                          "got bigint"),
        6: ("unstorable", "field 'customer' (column doc) contains a NUL character "
                          "(\\\\u0000), which jsonb cannot store"),  # COPY-escaped
    }


@pytest.mark.parametrize("declared", [
    "jsonb", "array<long>", "array<int>", "array<double>", "array<boolean>", "array<string>",
    "array<timestamp>", "array<date>", "array<decimal(5,2)>"])
@pytest.mark.parametrize("required", [True, False], ids=["required", "optional"])
def test_the_generated_row_encoder_agrees_with_the_rules_at_a_nested_path(declared, required):
    values = [None, 1, -2**40, 2.5, True, "x", "2026-01-02", "2026-01-02T03:04:05Z", [],
              [1, None], ["a", "b"], [True], [2.5, 1], ["2026-01-02T03:04:05+01:00"],
              ["2026-01-02"], [[1]], [{"a": 1}], {"a": [1, "x"]}, [2**40], ["1.005"]]
    rule = column_type(declared).from_json
    columns = (("id", "long", True), ("v", declared, required, ("a", "b")))
    rows, dead_lines, _ = encode([{"id": i, "a": {"b": v}} for i, v in enumerate(values)],
                                 columns)
    got = {int(line.split("\t")[2]): fields(line)[1] for line in rows}
    for i, v in enumerate(values):
        try:
            want = rule(v) if v is not None else None if required else "\\N"
        except Exception:  # noqa: BLE001 - the rule refuses it: so must the encoder
            want = None
        assert got.get(i) == want, (declared, required, v)
    assert len(rows) + len(dead_lines) == len(values)


def test_a_tombstone_key_is_read_at_the_key_columns_path_or_by_its_name():
    columns = (("id", "long", True, ("after", "id")), ("v", "string", False, ()))
    enc = Encoder("json", columns, 1, tombstone_key=("id",))
    out = enc.encode("t", 0, [Record(0, None, k=b'{"after": {"id": 4}}'),
                              Record(1, None, k=b'{"id": 5}'), Record(2, None, k=b"6")])
    assert [line.split("\t")[4] for line in out.tombstones] == ["4", "5", "6"]


# ---- Avro -----------------------------------------------------------------------------------
NESTED = {"type": "record", "name": "Order", "fields": [
    {"name": "orderId", "type": "long"},
    {"name": "customer", "type": ["null", {"type": "record", "name": "Customer", "fields": [
        {"name": "id", "type": "long"},
        {"name": "tags", "type": {"type": "array", "items": "string"}},
        {"name": "attrs", "type": {"type": "map", "values": "long"}}]}], "default": None},
    {"name": "scores", "type": {"type": "array", "items": ["null", "double"]}},
    {"name": "note", "type": ["null", "string"]},
]}
AVRO_COLUMNS = (("order_id", "long", True, ("orderId",)),
                ("customer_id", "long", True, ("customer", "id")),
                ("tags", "array<string>", False, ("customer", "tags")),
                ("customer", "jsonb", False, ()),
                ("scores", "array<double>", False, ()),
                ("rank", "long", False, ("customer", "attrs", "rank")),
                ("first", "long", False, ("note", "first")))


def test_avro_columns_read_nested_records_maps_arrays_and_name_the_path_when_refused(tmp_path):
    (tmp_path / "3.avsc").write_text(json.dumps(NESTED))
    good = {"orderId": 1, "customer": {"id": 7, "tags": ["x", "y"], "attrs": {"rank": 2}},
            "scores": [1.5, None], "note": None}
    records = [Record(0, wire(3, NESTED, good)),
               Record(1, wire(3, NESTED, {**good, "customer": None})),
               Record(2, wire(3, NESTED, {**good, "note": "n"}))]
    encoded = Encoder("avro", AVRO_COLUMNS, 1,
                      schemas=SchemaSource(schemas_dir=str(tmp_path))).encode("t", 0, records)
    assert [fields(line) for line in encoded.rows] == [
        ["1", "7", '{"x","y"}', '{"id":7,"tags":["x","y"],"attrs":{"rank":2}}',
         '{"1.5",NULL}', "2", "\\N"]]
    # The note is a string, not a record: a path through it is a wrong type.
    assert dead(encoded) == {
        1: ("missing_field", "required field 'customer.id' (column customer_id) is not in "
                             "the writer schema (writer schema id 3)"),
        2: ("wrong_type", "field 'note.first' (column first) (writer schema id 3): 'note' is "
                          "an Avro string, not a record"),
    }


def test_avro_wrong_array_elements_name_the_column_and_element(tmp_path):
    schema = {"type": "record", "name": "R", "fields": [
        {"name": "ids", "type": {"type": "array", "items": "string"}}]}
    (tmp_path / "4.avsc").write_text(json.dumps(schema))
    fastavro.parse_schema(schema)
    encoded = Encoder("avro", (("ids", "array<long>", False),), 1,
                      schemas=SchemaSource(schemas_dir=str(tmp_path))).encode(
        "t", 0, [Record(0, wire(4, schema, {"ids": ["1"]}))])
    assert dead(encoded) == {0: ("wrong_type", "field 'ids' (writer schema id 4): expected "
                                 "array<long>, got array: element [0] is string")}


def test_jsonb_keeps_numbers_as_written_and_a_double_beside_it_still_reads_decimals():
    # jsonb parses the record exactly (as a decimal wider than 15 digits does): no digit of
    # a number is lost to a double. A double column beside it takes the exact numbers too
    # (before: 'expected double, got double' beside a wide decimal).
    for columns in ((("j", "jsonb", False), ("d", "double", False)),
                    (("w", "decimal(20,2)", False), ("d", "double", False))):
        raw = b'{"j": {"x": 1.23456789012345678901234, "y": [1, 2.50]}, "w": 1.5, "d": 2.5}'
        encoded = encode([raw], columns)
        assert encoded.dead == []
        got = fields(encoded.rows[0])
        assert got == (['{"x":1.23456789012345678901234,"y":[1,2.50]}', "2.5"]
                       if columns[0][0] == "j" else ["1.50", "2.5"])


def test_a_wrong_element_parsed_exactly_is_named_as_json_names_it():
    columns = (("j", "jsonb", False), ("p", "array<decimal(4,2)>", False))
    assert dead(encode([{"p": [1.5, 123.5]}], columns)) == {
        0: ("wrong_type", "field 'p': expected array<decimal(4,2)>, got array: element [1] "
                          "is double")}
