"""The protobuf format: the Confluent wire header (message indexes), the value rules and
projection, with messages built here from .proto text compiled by the same protoc the
executors run, schemas from a schemas_dir; the real registry is tested in
tests/integration/test_protobuf_registry.py."""

from datetime import UTC, datetime

import pytest

from pipeline.config import load_settings, parse_settings
from pipeline.errors import ConfigError, Kind, TaskError
from pipeline.formats.encode import Encoder
from pipeline.formats.protobuf.header import encode_header, header
from pipeline.formats.protobuf.schemas import writer_schema
from pipeline.formats.refused import Refused
from pipeline.formats.schema_source import SchemaSource
from tests.unit.test_avro import dead, fields
from tests.unit.test_encode import Record

V1 = """syntax = "proto3";
package shop;
import "google/protobuf/timestamp.proto";
import "google/protobuf/wrappers.proto";
enum Channel { WEB = 0; APP = 1; }
message Order {
  int64 order_id = 1;
  int32 qty = 2;
  float price = 3;
  optional string coupon = 4;
  google.protobuf.Timestamp placed_at = 5;
  Channel channel = 6;
  google.protobuf.Int64Value points = 7;
  repeated string tags = 8;
  message Line { string sku = 1; int64 qty = 2; }
}
message Refund { int64 order_id = 1; string reason = 2; }
"""
# v2: qty widened to int64, coupon removed, a field nobody declared added.
V2 = """syntax = "proto3";
package shop;
message Order { int64 order_id = 1; int64 qty = 2; double price = 3; string note = 9; }
"""
COLUMNS = (("order_id", "long", True), ("qty", "long", False), ("price", "double", False),
           ("coupon", "string", False), ("placed_at", "timestamp", False),
           ("channel", "string", False), ("points", "long", False))


@pytest.fixture
def schemas(tmp_path):
    for schema_id, text in ((1, V1), (2, V2)):
        (tmp_path / f"{schema_id}.proto").write_text(text)
    return SchemaSource(schemas_dir=str(tmp_path))


def message(schemas, schema_id: int, indexes=(0,), **values):
    return writer_schema(schemas, schema_id).message(indexes)(**values)


def wire(schema_id: int, msg, indexes=(0,)) -> bytes:
    return encode_header(schema_id, indexes) + msg.SerializeToString()


@pytest.mark.parametrize("indexes, encoded", [
    ((0,), b"\x00"),  # the shorthand for the file's first message
    ((1,), b"\x02\x02"),  # count 1 (zigzag 2), index 1 (zigzag 2)
    ((0, 0), b"\x04\x00\x00"),
    ((2, 70), b"\x04\x04\x8c\x01"),  # a two-byte varint
])
def test_the_header_reads_the_schema_id_and_the_message_index_path(indexes, encoded):
    value = b"\x00\x00\x00\x01\x2c" + encoded + b"payload"
    assert encode_header(300, indexes)[5:] == encoded
    assert header(value) == (300, indexes, 5 + len(encoded))


@pytest.mark.parametrize("indexes", [(0,), (1,), (0, 0), (2, 70), (5, 1, 3)])
def test_the_header_reads_what_confluent_kafkas_serializer_writes(indexes):
    # confluent-kafka's own encoder of the header (its ProtobufSerializer calls it).
    from confluent_kafka.schema_registry.common.serde import SchemaId

    value = SchemaId("PROTOBUF", 70000, None, list(indexes)).id_to_bytes()
    assert header(value + b"\x08\x01") == (70000, indexes, len(value))


@pytest.mark.parametrize("value, error_type, says", [
    (b"\x01\x00\x00\x00\x01\x00", "bad_magic_byte", "first byte is 0x01"),
    (b"", "corrupt_protobuf", "value is empty"),
    (b"\x00\x00\x00\x01", "corrupt_protobuf", "too short"),
    (b"\x00\x00\x00\x00\x01\x04\x02", "corrupt_protobuf", "runs off the end"),
    (b"\x00\x00\x00\x00\x01\x8c", "corrupt_protobuf", "runs off the end"),
    (b"\x00\x00\x00\x00\x01\x01\x02", "corrupt_protobuf", "message index count -1"),
])
def test_a_bad_header_is_refused_with_its_reason(value, error_type, says):
    with pytest.raises(Refused) as e:
        header(value)
    assert e.value.error_type == error_type and says in e.value.message


def test_two_writer_versions_project_to_the_declared_columns_by_name(schemas):
    at = datetime(2026, 11, 25, 15, 30, 1, 250000, tzinfo=UTC)
    full = message(schemas, 1, order_id=1, qty=3, price=1.5, coupon="X\tY", channel="APP")
    full.placed_at.FromDatetime(at)
    full.points.value = 7
    bare = message(schemas, 1, order_id=2)  # proto3 scalars unset: their defaults
    v2 = message(schemas, 2, order_id=3, qty=1 << 40, price=0.1, note="n")
    encoded = Encoder("protobuf", COLUMNS, 9, schemas=schemas).encode("t", 0, [
        Record(0, wire(1, full)), Record(1, wire(1, bare)), Record(2, wire(2, v2))])
    assert encoded.dead == []
    assert [fields(r) for r in encoded.rows] == [
        ["1", "3", "1.5", "X\\tY", "2026-11-25 15:30:01.250000+00:00", "APP", "7", "9"],
        ["2", "0", "0.0", "\\N", "\\N", "WEB", "\\N", "9"],
        ["3", "1099511627776", "0.1", "\\N", "\\N", "\\N", "\\N", "9"]]


def test_a_nested_message_is_found_by_its_index_path(schemas):
    line = message(schemas, 1, (0, 0), sku="s", qty=4)
    refund = message(schemas, 1, (1,), order_id=5, reason="late")
    encoder = Encoder("protobuf", (("sku", "string", True), ("order_id", "long", False)), 1,
                      schemas=schemas)
    encoded = encoder.encode("t", 0, [Record(0, wire(1, line, (0, 0))),
                                      Record(1, wire(1, refund, (1,))),
                                      Record(2, wire(1, refund, (3,)))])
    assert [fields(r) for r in encoded.rows] == [["s", "\\N", "1"]]
    bad = dead(encoded)
    assert bad[1][0] == "missing_field" and "'sku' is not in the writer schema" in bad[1][1]
    assert bad[2][0] == "unknown_message" and "indexes [3]" in bad[2][1]


def test_bad_records_are_dead_letters_naming_field_and_schema_id(schemas):
    ok = wire(1, message(schemas, 1, order_id=1, coupon="a long enough coupon"))
    tags = (("order_id", "long", True), ("tags", "string", False))
    encoded = Encoder("protobuf", COLUMNS, 1, schemas=schemas).encode("t", 0, [
        Record(0, ok[:-4]),  # truncated inside the coupon string
        Record(1, b"\x00\x00\x00\x00\x63\x00" + ok[6:]),  # id 99: not in the folder
        Record(2, b"\x7b" + ok[1:]),
        Record(3, None)])
    bad = dead(encoded)
    assert bad[0][0] == "corrupt_protobuf" and "shop.Order of writer schema id 1" in bad[0][1]
    assert bad[1][0] == "unknown_schema" and "no 99.proto" in bad[1][1]
    assert bad[2][0] == "bad_magic_byte" and bad[3][0] == "null_value"
    wrong = Encoder("protobuf", tags, 1, schemas=schemas).encode("t", 0, [
        Record(0, wire(1, message(schemas, 1, order_id=1, tags=["a"])))])
    assert dead(wrong)[0] == ("wrong_type", "field 'tags' (writer schema id 1): expected "
                              "string, got repeated string")


def test_a_schema_that_does_not_compile_stops_the_run_as_a_config_error(tmp_path):
    (tmp_path / "4.proto").write_text('syntax = "proto3"; message X { int64 a = 1 }')
    encoder = Encoder("protobuf", COLUMNS, 1, schemas=SchemaSource(schemas_dir=str(tmp_path)))
    with pytest.raises(TaskError) as e:
        encoder.encode("t", 0, [Record(0, encode_header(4) + b"")])
    said = e.value.message
    assert e.value.kind == Kind.CONFIG and "writer schema id 4 is not a valid .proto" in said
    assert 'schema_4.proto:1:44: Expected ";"' in said and "pipeline-proto-" not in said


def test_a_serialized_descriptor_is_a_writer_schema_as_the_proto_text_is(schemas, tmp_path):
    # What confluent-kafka's ProtobufSerializer registers by default: the file's
    # FileDescriptorProto, base64 (it imports well-known files without a reference).
    import base64

    text_schema = writer_schema(schemas, 1)
    (tmp_path / "7.proto").write_text(base64.b64encode(
        text_schema.file.SerializeToString()).decode())

    order = message(schemas, 7, order_id=5, qty=2, tags=["a"])
    order.placed_at.FromDatetime(datetime(2026, 1, 2, tzinfo=UTC))

    encoded = Encoder("protobuf", COLUMNS, 1, schemas=schemas).encode(
        "t", 0, [Record(0, wire(7, order))])
    assert encoded.dead == []
    assert [fields(r) for r in encoded.rows] == [
        ["5", "2", "0.0", "\\N", "2026-01-02 00:00:00+00:00", "WEB", "\\N", "1"]]


def test_protocs_error_is_one_line_without_absl_log_noise(tmp_path):
    (tmp_path / "6.proto").write_text("message X { int64 a = 1 }")  # no syntax line
    (tmp_path / "8.proto").write_text("bWVzc2FnZQ==")  # base64, not a descriptor
    for schema_id in (6, 8):
        encoder = Encoder("protobuf", COLUMNS, 1,
                          schemas=SchemaSource(schemas_dir=str(tmp_path)))
        with pytest.raises(TaskError) as e:
            encoder.encode("t", 0, [Record(0, encode_header(schema_id) + b"")])
        said = e.value.message
        assert f"writer schema id {schema_id} is not a valid .proto" in said, said
        assert "absl" not in said and "W0000" not in said and "\n" not in said, said


def test_the_example_config_reads_its_schemas_dir():
    s = load_settings("conf/examples/protobuf.toml", environ={})
    assert s.sink.format == "protobuf"
    cls = writer_schema(s.schema_registry, 1).message((0,))
    assert cls.DESCRIPTOR.full_name == "shop.Order"
    columns = tuple((c.name, c.type, c.required) for c in s.sink.columns)
    msg = cls(order_id=1, customer="c", amount=2.5)
    encoded = Encoder("protobuf", columns, 1, schemas=s.schema_registry).encode(
        "t", 0, [Record(0, wire(1, msg))])
    assert [fields(r) for r in encoded.rows] == [["1", "c", "2.5", "\\N", "\\N", "1"]]


def test_the_config_takes_protobuf_with_a_schema_source_and_refuses_a_transform(tmp_path):
    def doc(**sink):
        return {"pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "k:9092",
                                                     "topics": ["t"]},
                "database": {"url": "postgresql://h/db"},
                "sink": {"format": "protobuf", "table": "t",
                         "columns": {"order_id": "long not null"}, **sink},
                "schema_registry": {"url": "http://r:8081"}}

    s = parse_settings(doc(mode="upsert", key=["order_id"]), environ={})
    assert (s.sink.format, s.sink.mode, s.schema_registry.url) == (
        "protobuf", "upsert", "http://r:8081")
    # A transform gets the decoded columns (executor/transform/feed.py), a nested path too.
    t = parse_settings(doc(transform="m:f", columns={"c": {"type": "long", "from": "a.b"}}),
                       environ={})
    assert (t.sink.transform, t.sink.columns[0].source) == ("m:f", ("a", "b"))
    bare = doc()
    del bare["schema_registry"]
    with pytest.raises(ConfigError, match="sink.format = 'protobuf' needs exactly one of"):
        parse_settings(bare, environ={})


NESTED = """syntax = "proto3";
package shop;
message Customer { int64 id = 1; string name = 2; }
message Order {
  int64 order_id = 1;
  Customer customer = 2;
  repeated int64 qtys = 3;
  repeated string tags = 4;
  map<string, int64> counts = 5;
  string note = 6;
}
"""


def test_paths_walk_messages_and_repeated_fields_fill_arrays_and_jsonb(tmp_path):
    (tmp_path / "5.proto").write_text(NESTED)
    schemas = SchemaSource(schemas_dir=str(tmp_path))
    columns = (("order_id", "long", True, ()), ("customer_id", "long", False, ("customer", "id")),
               ("customer", "jsonb", False, ()), ("qtys", "array<long>", False, ()),
               ("tags", "array<string>", False, ()), ("counts", "jsonb", False, ()))
    full = message(schemas, 5, (1,), order_id=1, qtys=[3, -4], tags=["a\tb", "c"],
                   counts={"x": 2})
    full.customer.id, full.customer.name = 42, "Ann"
    bare = message(schemas, 5, (1,), order_id=2)
    encoded = Encoder("protobuf", columns, 1, schemas=schemas).encode("t", 0, [
        Record(0, wire(5, full, (1,))), Record(1, wire(5, bare, (1,)))])
    assert encoded.dead == []
    assert [fields(r) for r in encoded.rows] == [
        ["1", "42", '{"id":"42","name":"Ann"}', '{"3","-4"}', '{"a\\tb","c"}', '{"x":2}', "1"],
        ["2", "\\N", "\\N", "{}", "{}", "{}", "1"]]
    through = Encoder("protobuf", (("x", "long", False, ("note", "id")),), 1, schemas=schemas)
    assert dead(through.encode("t", 0, [Record(0, wire(5, bare, (1,)))]))[0] == (
        "wrong_type", "field 'note.id' (column x) (writer schema id 5): 'note' is a string, "
        "not a message")
