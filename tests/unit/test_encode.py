"""Records -> COPY text lines, without Kafka or Spark (the executors' per-record work)."""

import json
import struct
from dataclasses import dataclass
from decimal import ROUND_HALF_UP, Decimal

import pytest

from pipeline.encode import Encoder, converter, headers_json, kafka_timestamp, text

COLUMNS = (("order_id", "long", True), ("customer", "string", True),
           ("amount", "decimal(12,2)", False), ("placed_at", "timestamp", False))


@dataclass
class Record:
    """The confluent-kafka Message methods the encoder uses."""
    o: int
    v: bytes | None
    k: bytes | None = None
    h: list | None = None
    ts: int = 1_700_000_000_123

    def offset(self):
        return self.o

    def value(self):
        return self.v

    def key(self):
        return self.k

    def headers(self):
        return self.h

    def timestamp(self):
        return (1, self.ts)


def dead_types(values, columns=COLUMNS):
    _, dead, _ = Encoder("json", columns, 1).encode("t", 0, [Record(i, v)
                                                          for i, v in enumerate(values)])
    return [line.rstrip("\n").split("\t")[7] for line in dead]


def test_a_good_record_is_one_line_in_table_order_with_the_run_id():
    rows, dead, _ = Encoder("json", COLUMNS, 42).encode("orders", 3, [Record(
        17, b'{"order_id": 1, "customer": "a\\tb\\\\c", "amount": 1.005, '
            b'"placed_at": "2026-03-08T01:30:00-05:00", "extra": [1]}')])
    assert dead == []
    # The decimal and the timestamp with its offset are passed as written (validated here,
    # rounded and read by Postgres: see test_bad_input's catalogue for what is stored).
    assert rows == ["orders\t3\t17\t2023-11-14 22:13:20.123000+00\t1\ta\\tb\\\\c\t1.005\t"
                    "2026-03-08T01:30:00-05:00\t42\n"]


def test_optional_fields_absent_or_null_are_copy_nulls():
    rows, _, _ = Encoder("json", COLUMNS, 1).encode("t", 0, [Record(
        0, b'{"order_id": 1, "customer": "c", "amount": null}')])
    assert rows[0].split("\t")[6:8] == ["\\N", "\\N"]


def test_each_bad_record_gets_its_dead_letter_type():
    assert dead_types([None, b"\xff\xfe", b"{not json", b"", b"[1]", b"null",
                       b'{"order_id": "seven", "customer": "c"}',
                       b'{"order_id": 3, "customer": 5}',
                       b'{"amount": 3.5}', b'{"order_id": null, "customer": "c"}',
                       b'{"order_id": 1, "customer": "c", "amount": 1e20}',
                       b'{"order_id": 1, "customer": "c", "placed_at": "yesterday"}',
                       b'{"order_id": 1.5, "customer": "c"}',
                       b'{"order_id": true, "customer": "c"}',
                       b'{"order_id": 9223372036854775808, "customer": "c"}']) == [
        "null_value", "invalid_utf8", "malformed_json", "malformed_json", "not_an_object",
        "not_an_object", "wrong_type", "wrong_type", "missing_field", "missing_field",
        "wrong_type", "wrong_type", "wrong_type", "wrong_type", "wrong_type"]


def test_a_wrong_type_is_reported_before_a_missing_field_as_spark_marks_it():
    _, dead, _ = Encoder("json", COLUMNS, 1).encode("t", 0, [Record(
        0, b'{"customer": "c", "amount": "lots"}')])
    assert dead[0].split("\t")[7:9] == ["wrong_type",
                                        "field 'amount': expected decimal(12,2), got string\n"]


def test_a_nul_character_makes_a_dead_letter_not_a_failed_copy():
    assert dead_types([b'{"order_id": 1, "customer": "a\\u0000b"}']) == ["unstorable"]
    rows, dead, _ = Encoder("raw", (), 1).encode("t", 0, [Record(0, b"v", h=[("k\x00", b"x")])])
    assert rows == [] and dead[0].split("\t")[7] == "unstorable"


def test_a_lone_surrogate_escape_is_a_dead_letter_on_both_json_parsers():
    """orjson refuses it (malformed); the standard library, used for wide decimals, lets it
    into a string that cannot be written as UTF-8: a dead letter, not a failing task."""
    value = b'{"order_id": 1, "customer": "a\\ud800b"}'
    good = b'{"order_id": 2, "customer": "c"}'
    wide = (("order_id", "long", True), ("customer", "string", True),
            ("amount", "decimal(20,2)", False))
    for columns, expected in ((COLUMNS, "malformed_json"), (wide, "unstorable")):
        rows, dead, _ = Encoder("json", columns, 1).encode("t", 0, [Record(0, value),
                                                                 Record(1, good)])
        assert [r.split("\t")[2] for r in rows] == ["1"]
        assert [line.split("\t")[7] for line in dead] == [expected]
        "".join(rows + dead).encode()  # what staging writes


def test_the_original_bytes_of_a_dead_letter_are_kept_as_bytea_hex():
    _, dead, _ = Encoder("json", COLUMNS, 1).encode("t", 0, [Record(5, b"\xff", k=b"\x00k")])
    fields = dead[0].split("\t")
    assert fields[:5] == ["t", "0", "5", "\\\\x006b", "\\\\xff"]


def binary_tuple(row: bytes) -> list:
    """One COPY binary tuple -> its fields as bytes (None for NULL)."""
    (n,), pos, fields = struct.unpack_from(">h", row), 2, []
    for _ in range(n):
        (size,) = struct.unpack_from(">i", row, pos)
        pos += 4
        fields.append(None if size < 0 else row[pos:pos + size])
        pos += max(size, 0)
    assert pos == len(row)
    return fields


def test_raw_rows_are_copy_binary_tuples_keeping_bytes_headers_and_nulls():
    rows, dead, _ = Encoder("raw", (), 9).encode("t", 1, [
        Record(0, b"v\t", b"k", [("h", b"\x00\x01"), ("n", None), ("e", b"")]),
        Record(1, None, None, None)])
    assert dead == []
    first = binary_tuple(rows[0])
    assert first[:5] == [b"t", struct.pack(">i", 1), struct.pack(">q", 0), b"k", b"v\t"]
    assert first[5] == (b'\x01[{"key":"h","value_b64":"AAE="},{"key":"n"},'
                        b'{"key":"e","value_b64":""}]')
    # microseconds since 2000-01-01 UTC: 2023-11-14 22:13:20.123
    assert struct.unpack(">q", first[6])[0] == (1_700_000_000_123 - 946_684_800_000) * 1000
    assert first[7] == struct.pack(">q", 9)
    assert binary_tuple(rows[1])[3:6] == [None, None, b"\x01[]"]


@pytest.mark.parametrize("declared,value,expected", [
    ("int", 2**31 - 1, "2147483647"),
    ("double", 3, "3.0"),
    ("double", "NaN", "NaN"),
    ("boolean", False, "f"),
    ("decimal(4,2)", "12.345", "12.35"),
    ("decimal(38,2)", 10**35, str(10**35)),
    ("decimal(4,2)", 99.994, "99.99"),  # near the precision: rounded exactly here
    ("decimal(38,2)", "1" * 36, "1" * 36 + ".00"),
    ("timestamp", 0, "1970-01-01 00:00:00+00:00"),
    ("timestamp", "2026-11-01 01:30:00", "2026-11-01 01:30:00+00:00"),
    ("timestamp", "2026-11-01T01:30:00.5Z", "2026-11-01T01:30:00.5Z"),
    ("timestamp", "2026-11-01T01:30:00+0100", "2026-11-01 00:30:00+00:00"),
    # Postgres refuses offsets beyond 15:59, which Python accepts: converted to UTC here.
    ("timestamp", "2026-01-01T00:00:00+16:00", "2025-12-31 08:00:00+00:00"),
    ("timestamp", "2026-01-01T00:00:00-15:59", "2026-01-01T00:00:00-15:59"),
    ("date", "2026-02-28", "2026-02-28"),
    ("date", "2026-02-28T10:00:00Z", "2026-02-28"),
])
def test_converters_accept_what_the_declared_type_allows(declared, value, expected):
    assert converter(declared)(value) == expected


@pytest.mark.parametrize("declared,value", [
    ("int", 2**31), ("double", "1.5"), ("decimal(4,2)", 99.995),
    ("timestamp", "2026-02-30T00:00:00Z"), ("boolean", 1), ("decimal(4,2)", "123.4"),
    ("decimal(4,2)", "abc"), ("timestamp", 1.5), ("date", "2026-02-30"), ("string", 5),
])
def test_converters_refuse_what_it_does_not(declared, value):
    with pytest.raises(ValueError):
        converter(declared)(value)


def test_kafka_timestamps_are_utc_milliseconds_including_before_the_epoch():
    assert kafka_timestamp(1_700_000_000_123) == "2023-11-14 22:13:20.123000+00"
    assert kafka_timestamp(-1) == "1969-12-31 23:59:59.999000+00"


def test_text_escapes_what_copy_unescapes():
    assert text("a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e"
    assert headers_json([("é", b"\xff")]) == '[{"key":"é","value_b64":"/w=="}]'


# Values the inlined row encoder must treat exactly as the column converters do: each is
# either refused by both (a dead letter) or written as the converter writes it.
PARITY = {
    "long": [0, -1, 2**63 - 1, -2**63, 2**63, -2**63 - 1, 1.0, 1.5, True, "1", [1], {}],
    "int": [2**31 - 1, -2**31, 2**31, -2**31 - 1, 7, 7.0, False],
    "string": ["c88", "", "a b", "a\tb", "back\\slash", "nul\x00", "é✓", "x\ny", 5, True,
               ["a"]],
    "boolean": [True, False, 0, 1, "true"],
    "double": [1.5, 3, "NaN", "-Infinity", "1.5", 1e308],
    "decimal(12,2)": [0, 1.005, -1.005, 9999999998.5, 9999999999, 9999999999.994,
                      9999999999.995, -9999999999.995, 1e-7, 1e20, 10**10, -(10**10), "2.5",
                      " 2.5 ", "abc", True, 99.994, 12345678.125],
    "decimal(2,2)": [0.5, 0.995, 1, -0.004],
    "timestamp": ["2026-01-01T00:00:00Z", "2026-01-01 00:00:00+00:00",
                  "2026-01-01T00:00:00.123456+05:30", "2026-01-01T00:00:00.5-15:59",
                  "2026-01-01T00:00:00+16:00", "2026-01-01T00:00:00", " 2026-01-01T00:00:00Z",
                  "2026-02-30T00:00:00Z", "2026-01-01T24:00:00Z", "20260101T000000Z",
                  "2026-01-01", "yesterday", 0, -1, 10**12, 1.5, True],
    "date": ["2026-02-28", "2026-02-30", "2026-02-28T10:00:00Z", 5],
}


@pytest.mark.parametrize("declared", sorted(PARITY))
@pytest.mark.parametrize("required", [True, False], ids=["required", "optional"])
def test_the_inlined_row_encoder_agrees_with_the_column_converters(declared, required):
    convert = converter(declared)
    columns = (("id", "long", True), ("v", declared, required))
    records = [Record(i, json.dumps({"id": i, "v": v}).encode())
               for i, v in enumerate(PARITY[declared])]
    rows, dead, _ = Encoder("json", columns, 1).encode("t", 0, records)
    written = {int(r.split("\t")[4]): stored(declared, r.rstrip("\n").split("\t")[5])
               for r in rows}
    assert len(rows) + len(dead) == len(records)
    for i, v in enumerate(PARITY[declared]):
        try:
            expected = stored(declared, convert(json.loads(json.dumps(v))))
        except ValueError:
            expected = None
        assert written.get(i) == expected, (declared, v, written.get(i), expected)


def stored(declared: str, field: str):
    """A decimal field as Postgres stores it: rounded half away from zero to the scale
    (the converter writes some values rounded, the row encoder as the JSON had them)."""
    if declared.startswith("decimal(") and field != "\\N":
        scale = int(declared[:-1].split(",")[1])
        return Decimal(field).quantize(Decimal(1).scaleb(-scale), rounding=ROUND_HALF_UP)
    return field
