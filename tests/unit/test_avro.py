"""The avro format: Confluent wire format records encoded here with fastavro, decoded by the
Encoder as an executor does, schemas from a schemas_dir and (for the client code only) from
a tiny stdlib HTTP server answering the registry's GET /schemas/ids/{id}; the real registry
is tested elsewhere."""

import io
import json
import pickle
import struct
import threading
import uuid
from datetime import UTC, date, datetime
from decimal import Decimal
from functools import partial
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import fastavro
import pytest

from pipeline.errors import Kind, TaskError
from pipeline.executor.task import EncoderSettings
from pipeline.formats.encode import Encoder as Encoder_
from pipeline.formats.schema_source import SchemaSource
from tests.unit.test_encode import Record, placed

# The typed rules, read off the COPY text rows (a transform's feed reads them; a run's
# staged rows are the same values as COPY binary tuples, binary_fields.from_text, held to
# this text as Postgres reads it back by tests/integration/test_avro_binary.py).
Encoder = partial(Encoder_, text_rows=True)

V1 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "qty", "type": "int"},
    {"name": "price", "type": "float"},
    {"name": "coupon", "type": ["null", "string"], "default": None},
]}
# v2: qty promoted to long, price to double, coupon removed, a new field nobody declared.
V2 = {"type": "record", "name": "Order", "namespace": "shop", "fields": [
    {"name": "order_id", "type": "string"},
    {"name": "qty", "type": "long"},
    {"name": "price", "type": "double"},
    {"name": "channel", "type": "string", "default": "web"},
]}
LOGICAL = {"type": "record", "name": "Typed", "fields": [
    {"name": "amount", "type": {"type": "bytes", "logicalType": "decimal", "precision": 10,
                                "scale": 2}},
    {"name": "at_ms", "type": {"type": "long", "logicalType": "timestamp-millis"}},
    {"name": "at_us", "type": {"type": "long", "logicalType": "timestamp-micros"}},
    {"name": "day", "type": {"type": "int", "logicalType": "date"}},
    {"name": "id", "type": {"type": "string", "logicalType": "uuid"}},
]}
COLUMNS = (("order_id", "string", True), ("qty", "long", False), ("price", "double", False),
           ("coupon", "string", False))


def wire(schema_id: int, schema: dict, value: dict) -> bytes:
    out = io.BytesIO()
    out.write(struct.pack(">bI", 0, schema_id))
    fastavro.schemaless_writer(out, fastavro.parse_schema(schema, named_schemas={}), value)
    return out.getvalue()


@pytest.fixture
def schemas(tmp_path):
    for schema_id, schema in ((1, V1), (2, V2), (7, LOGICAL)):
        (tmp_path / f"{schema_id}.avsc").write_text(json.dumps(schema))
    return SchemaSource(schemas_dir=str(tmp_path))


def fields(line: str) -> list[str]:
    return line.rstrip("\n").split("\t")[4:]


def dead(encoded) -> dict[int, tuple[str, str]]:
    return {int(f[2]): (f[7], f[8].rstrip("\n"))
            for f in (line.split("\t") for line in encoded.dead)}


def test_two_writer_versions_project_to_the_declared_columns_by_name(schemas):
    encoder = Encoder("avro", COLUMNS, 9, schemas=schemas)
    encoded = encoder.encode("t", 0, [
        Record(0, wire(1, V1, {"order_id": "a", "qty": 3, "price": 1.5, "coupon": "X"})),
        Record(1, wire(1, V1, {"order_id": "b\tc", "qty": -1, "price": 2.0, "coupon": None})),
        Record(2, wire(2, V2, {"order_id": "c", "qty": 1 << 40, "price": 0.1, "channel": "app"}))])
    assert encoded.dead == [] and encoded.tombstones == []
    assert [fields(r) for r in encoded.rows] == [
        ["a", "3", "1.5", "X", "9"],
        ["b\\tc", "-1", "2.0", "\\N", "9"],
        ["c", str(1 << 40), "0.1", "\\N", "9"]]  # coupon gone from v2: null
    assert encoded.rows[0].split("\t")[:4] == ["t", "0", "0", "2023-11-14 22:13:20.123000+00"]


def test_logical_types_map_to_their_columns(schemas):
    columns = (("amount", "decimal(10,2)", True), ("at_ms", "timestamp", True),
               ("at_us", "timestamp", True), ("day", "date", True), ("id", "string", True))
    u = uuid.UUID("12345678-1234-5678-1234-567812345678")
    value = {"amount": Decimal("-1234.50"), "at_ms": datetime(2024, 2, 29, 12, 0, 1, 5000, UTC),
             "at_us": datetime(1969, 12, 31, 23, 59, 59, 999999, UTC), "day": date(2024, 3, 1),
             "id": u}
    encoded = Encoder("avro", columns, 1, schemas=schemas).encode(
        "t", 0, [Record(0, wire(7, LOGICAL, value))])
    assert encoded.dead == []
    # A bytes decimal of the column's scale as its unscaled integer and the scale's
    # exponent (formats/avro/raw.py): Postgres and Arrow read it as -1234.50.
    assert fields(encoded.rows[0]) == [
        "-123450e-2", "2024-02-29 12:00:01.005000+00:00", "1969-12-31 23:59:59.999999+00:00",
        "2024-03-01", str(u), "1"]


def test_a_wider_decimal_column_rescales_and_a_narrower_one_is_a_wrong_type(schemas):
    value = {"amount": Decimal("99999999.99"), "at_ms": datetime(2024, 1, 1, tzinfo=UTC),
             "at_us": datetime(2024, 1, 1, tzinfo=UTC), "day": date(2024, 1, 1),
             "id": uuid.uuid4()}
    good = Encoder("avro", (("amount", "decimal(12,3)", True),), 1, schemas=schemas)
    assert fields(good.encode("t", 0, [Record(0, wire(7, LOGICAL, value))]).rows[0]) == [
        "99999999.990", "1"]
    narrow = Encoder("avro", (("amount", "decimal(5,2)", True),), 1, schemas=schemas)
    assert dead(narrow.encode("t", 0, [Record(0, wire(7, LOGICAL, value))])) == {
        0: ("wrong_type", "field 'amount' (writer schema id 7): expected decimal(5,2), got "
                          "decimal: 99999999.99 is too large for decimal(5,2) (at most 3 "
                          "digits before the point)")}


def test_bad_records_are_dead_letters_with_their_reasons(schemas):
    good = wire(1, V1, {"order_id": "a", "qty": 3, "price": 1.5, "coupon": None})
    encoded = Encoder("avro", COLUMNS, 1, schemas=schemas).encode("t", 0, [
        Record(0, b'{"order_id": "a"}'),  # JSON where Avro was expected
        Record(1, wire(99, V1, {"order_id": "a", "qty": 3, "price": 1.5, "coupon": None})),
        Record(2, good[:-3]),  # truncated
        Record(3, good + b"\x00\x00"),  # trailing bytes
        Record(4, b"\x00\x00\x01"),  # shorter than the header
        Record(5, None),  # not an upsert: a null value is a dead letter
        Record(6, good),
        Record(7, wire(1, V1, {"order_id": "a\x00", "qty": 3, "price": 1.5, "coupon": None})),
    ])
    assert placed(encoded) == {0: "bad_magic_byte", 1: "unknown_schema", 2: "corrupt_avro",
                               3: "corrupt_avro", 4: "corrupt_avro", 5: "null_value", 6: "row",
                               7: "unstorable"}
    reasons = dead(encoded)
    assert "first byte is 0x7b" in reasons[0][1]
    assert "schema id 99 is not in" in reasons[1][1] and "99.avsc" in reasons[1][1]
    assert "writer schema id 1" in reasons[2][1] and "truncated" in reasons[2][1]
    assert reasons[3][1].startswith("2 bytes left after decoding")
    assert "5-byte header" in reasons[4][1]


def test_a_wrong_type_and_a_missing_required_field_name_the_field_and_schema_id(schemas):
    columns = (("order_id", "long", False), ("channel", "string", True))
    v1 = wire(1, V1, {"order_id": "a", "qty": 3, "price": 1.5, "coupon": None})
    v2 = wire(2, V2, {"order_id": "7", "qty": 3, "price": 1.5, "channel": "app"})
    encoded = Encoder("avro", columns[1:], 1, schemas=schemas).encode("t", 0, [
        Record(0, v1), Record(1, v2)])
    assert dead(encoded) == {0: ("missing_field", "required field 'channel' is not in the "
                                                  "writer schema (writer schema id 1)")}
    assert fields(encoded.rows[0]) == ["app", "1"]
    encoded = Encoder("avro", columns[:1], 1, schemas=schemas).encode("t", 0, [Record(0, v2)])
    assert dead(encoded) == {0: ("wrong_type", "field 'order_id' (writer schema id 2): "
                                               "expected long, got string")}


def test_an_int_column_refuses_a_long_out_of_its_range(schemas):
    big = wire(2, V2, {"order_id": "c", "qty": 1 << 40, "price": 0.1, "channel": "app"})
    small = wire(2, V2, {"order_id": "c", "qty": 5, "price": 0.1, "channel": "app"})
    encoded = Encoder("avro", (("qty", "int", False),), 1, schemas=schemas).encode(
        "t", 0, [Record(0, big), Record(1, small)])
    assert placed(encoded) == {0: "wrong_type", 1: "row"}


def test_an_upsert_tombstone_still_deletes_by_its_key(schemas):
    encoder = Encoder("avro", (("order_id", "string", True),), 4, ("order_id",),
                      schemas=schemas)
    encoded = encoder.encode("t", 0, [Record(0, None, b"k1")])
    assert placed(encoded) == {0: "tombstone"}


def test_a_missing_schemas_dir_stops_the_run_as_a_config_error(tmp_path):
    gone = SchemaSource(schemas_dir=str(tmp_path / "gone"))
    with pytest.raises(TaskError) as e:
        Encoder("avro", COLUMNS, 1, schemas=gone).encode("t", 0, [Record(0, b"\x00\0\0\0\1x")])
    assert e.value.kind is Kind.CONFIG and "schemas_dir" in e.value.message


def test_an_unparsable_schema_file_stops_the_run_naming_the_id(tmp_path):
    (tmp_path / "3.avsc").write_text('{"type": "no_such_type"}')
    source = SchemaSource(schemas_dir=str(tmp_path))
    with pytest.raises(TaskError) as e:
        Encoder("avro", COLUMNS, 1, schemas=source).encode("t", 0, [Record(0, b"\0\0\0\0\3")])
    assert e.value.kind is Kind.CONFIG and "writer schema id 3 is not a valid" in e.value.message


def test_the_encoder_settings_pickle_with_the_source_and_hide_the_password():
    source = SchemaSource(url="http://r:8081", user="u", password="s3cret")
    settings = EncoderSettings("avro", COLUMNS, 1, schemas=source)
    assert pickle.loads(pickle.dumps(settings)) == settings
    assert "s3cret" not in repr(settings)


# ---- the registry client (confluent-kafka's SchemaRegistryClient) ----------------------

class Registry(BaseHTTPRequestHandler):
    """GET /schemas/ids/{id} as the Confluent API answers it; counts requests."""
    schemas: dict[int, dict] = {}
    requests: list[str] = []
    status = 200

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).requests.append(self.path)
        schema_id = int(self.path.rsplit("/", 1)[1].split("?")[0])
        if self.status != 200:
            self._answer(self.status, {"error_code": self.status, "message": "no"})
        elif schema_id in self.schemas:
            self._answer(200, {"schema": json.dumps(self.schemas[schema_id])})
        else:
            self._answer(404, {"error_code": 40403, "message": "Schema not found"})

    def _answer(self, status, body):
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture
def registry():
    handler = type("R", (Registry,), {"schemas": {5: V1}, "requests": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield handler, f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_registry_schema_is_fetched_once_and_an_unknown_id_is_a_dead_letter(registry):
    handler, url = registry
    source = SchemaSource(url=url, user="u", password="p")
    value = wire(5, V1, {"order_id": "a", "qty": 3, "price": 1.5, "coupon": None})
    encoded = Encoder("avro", COLUMNS, 1, schemas=source).encode("t", 0, [
        Record(0, value), Record(1, value), Record(2, value[:1] + b"\0\0\0\6" + value[5:])])
    assert placed(encoded) == {0: "row", 1: "row", 2: "unknown_schema"}
    assert "has no schema id 6" in dead(encoded)[2][1]
    again = Encoder("avro", COLUMNS, 2, schemas=source).encode("t", 1, [Record(0, value)])
    assert placed(again) == {0: "row"}
    assert [p.split("?")[0] for p in handler.requests] == ["/schemas/ids/5", "/schemas/ids/6"]


def test_an_unreachable_registry_is_transient_naming_the_url_without_the_password():
    closed = SchemaSource(url="http://u:pw@127.0.0.1:9/", timeout_seconds=2)
    with pytest.raises(TaskError) as e:
        Encoder("avro", COLUMNS, 1, schemas=closed).encode("t", 0, [
            Record(0, b"\0\0\0\0\5abc")])
    assert e.value.kind is Kind.TRANSIENT
    assert "schema registry http://127.0.0.1:9/ unreachable fetching schema id 5" in str(e.value)
    assert "pw" not in e.value.message


def test_a_refused_login_is_a_config_error(registry):
    handler, url = registry
    handler.status = 401
    with pytest.raises(TaskError) as e:
        Encoder("avro", COLUMNS, 1, schemas=SchemaSource(url=url + "/x")).encode(
            "t", 0, [Record(0, b"\0\0\0\0\5abc")])
    assert e.value.kind is Kind.CONFIG and "HTTP 401" in e.value.message


def test_a_failing_registry_5xx_is_transient(registry):
    handler, url = registry
    handler.status = 503
    with pytest.raises(TaskError) as e:
        Encoder("avro", COLUMNS, 1, schemas=SchemaSource(url=url + "/y")).encode(
            "t", 0, [Record(0, b"\0\0\0\0\5abc")])
    assert e.value.kind is Kind.TRANSIENT and "HTTP 503" in e.value.message
    assert "rerun when the registry is healthy" in e.value.message


def test_a_corrupt_records_reason_is_the_same_on_every_run(schemas):
    # fastavro names its stream object, address included ("<_io.BytesIO object at 0x...>"):
    # a re-read of the same record must give the same dead letter.
    good = wire(1, V1, {"order_id": "a", "qty": 3, "price": 1.5, "coupon": None})
    reasons = {dead(Encoder("avro", COLUMNS, 1, schemas=schemas).encode(
        "t", 0, [Record(0, good[:-3])]))[0] for _ in range(3)}
    assert len(reasons) == 1
    (_, message), = reasons
    assert "truncated" in message and " at 0x" not in message
