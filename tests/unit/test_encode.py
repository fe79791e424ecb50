"""Records -> COPY text lines, without Kafka or Spark (the executors' per-record work)."""

import json
import struct
from dataclasses import dataclass, replace
from decimal import ROUND_HALF_UP, Decimal

import pytest

from pipeline.formats.encode import Encoder
from pipeline.formats.timestamps import kafka_timestamp
from pipeline.formats.types import column_type
from pipeline.formats.wire.text import headers_json, text

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
    assert column_type(declared).from_json(value) == expected


@pytest.mark.parametrize("declared,value", [
    ("int", 2**31), ("double", "1.5"), ("decimal(4,2)", 99.995),
    ("timestamp", "2026-02-30T00:00:00Z"), ("boolean", 1), ("decimal(4,2)", "123.4"),
    ("decimal(4,2)", "abc"), ("timestamp", 1.5), ("date", "2026-02-30"), ("string", 5),
])
def test_converters_refuse_what_it_does_not(declared, value):
    with pytest.raises(ValueError):
        column_type(declared).from_json(value)


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
    convert = column_type(declared).from_json
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


# ---- no record can stop a run ------------------------------------------------------------
DEEP = 3000  # beyond both parsers' nesting limits (orjson 1024, Python's recursion 1000)
DEEP_FIELD = (b'{"order_id": 1, "customer": "c", "extra": ' + b"[" * DEEP + b"]" * DEEP
              + b"}")
DEEP_ARRAY = b"[" * DEEP + b"]" * DEEP
WIDE = (("order_id", "long", True), ("customer", "string", True),
        ("amount", "decimal(20,2)", False))  # parsed by the standard library's json


def placed(encoded):
    """{offset: "row" | "tombstone" | dead-letter type} of one encoded batch."""
    rows, dead, tombstones = encoded
    out = {}
    for kind, lines in (("row", rows), ("tombstone", tombstones), (None, dead)):
        for line in lines:
            fields = (line.decode("latin-1") if isinstance(line, bytes) else line).split("\t")
            offset = (struct.unpack(">q", binary_tuple(line)[2])[0] if isinstance(line, bytes)
                      else int(fields[2]))
            assert offset not in out, f"offset {offset} placed twice"
            out[offset] = kind or fields[7]
    return out


@pytest.mark.parametrize("columns", [COLUMNS, WIDE], ids=["orjson", "stdlib-json"])
def test_json_nested_3000_deep_is_a_malformed_json_dead_letter_not_a_crash(columns):
    records = [Record(0, b'{"order_id": 0, "customer": "c"}'), Record(1, DEEP_FIELD),
               Record(2, DEEP_ARRAY), Record(3, b'{"order_id": 3, "customer": "c"}')]

    encoded = Encoder("json", columns, 1).encode("t", 0, records)

    assert placed(encoded) == {0: "row", 1: "malformed_json", 2: "malformed_json", 3: "row"}
    assert all("deeper" in line.split("\t")[8] for line in encoded.dead), encoded.dead


def test_a_tombstone_key_nested_3000_deep_is_a_bad_tombstone():
    columns = (("order_id", "long", True), ("customer", "string", False))
    encoded = Encoder("json", columns, 1, ("order_id",)).encode(
        "t", 0, [Record(0, None, DEEP_ARRAY), Record(1, None, b"1")])
    assert placed(encoded) == {0: "bad_tombstone", 1: "tombstone"}


class Boom(Exception):
    """Anything at all, raised where nobody expected it."""


def test_any_exception_while_encoding_one_record_makes_it_a_dead_letter_naming_it(
        monkeypatch):
    from pipeline.formats import types

    real = types.TYPES["timestamp"].from_json

    def explodes(x):
        if x == "boom":
            raise Boom("converter exploded")
        return real(x)

    monkeypatch.setitem(types.TYPES, "timestamp", replace(types.TYPES["timestamp"],
                                                          from_json=explodes))
    records = [Record(0, b'{"order_id": 0, "customer": "c", "placed_at": "2026-01-01"}'),
               Record(1, b'{"order_id": 1, "customer": "c", "placed_at": "boom"}', k=b"k1"),
               Record(2, b"{not json"),
               Record(3, b'{"order_id": 3, "customer": "c"}')]

    encoded = Encoder("json", COLUMNS, 1).encode("orders", 4, records)

    assert placed(encoded) == {0: "row", 1: "unexpected_error", 2: "malformed_json", 3: "row"}
    [boom] = [line.rstrip("\n").split("\t") for line in encoded.dead if "\t1\t" in line]
    assert boom[:5] == ["orders", "4", "1", "\\\\x" + b"k1".hex(),
                        "\\\\x" + records[1].v.hex()]  # coordinates and original bytes
    assert "Boom: converter exploded" in boom[8]


def test_any_exception_in_the_raw_sink_or_a_tombstone_makes_one_dead_letter(monkeypatch):
    from pipeline.formats import types
    from pipeline.formats.raw import format as raw_format

    real_headers, real_key = raw_format.headers_plain, types.TYPES["long"].from_json

    def headers_explode(h):
        if h[0][0] == "boom":
            raise Boom("headers exploded")
        return real_headers(h)

    def key_explodes(x):
        if x == 13:
            raise Boom("key exploded")
        return real_key(x)

    monkeypatch.setattr(raw_format, "headers_plain", headers_explode)
    raw = Encoder("raw", (), 1).encode("t", 0, [
        Record(0, b"a", h=[("ok", b"1")]), Record(1, b"b", h=[("boom", b"1")]),
        Record(2, b"c")])
    assert placed(raw) == {0: "row", 1: "unexpected_error", 2: "row"}

    monkeypatch.setitem(types.TYPES, "long", replace(types.TYPES["long"], from_json=key_explodes))
    upsert = Encoder("json", (("order_id", "long", True),), 1, ("order_id",)).encode(
        "t", 0, [Record(0, None, b"12"), Record(1, None, b"13"), Record(2, b'{"order_id": 2}')])
    assert placed(upsert) == {0: "tombstone", 1: "unexpected_error", 2: "row"}


# ---- Kafka timestamps beyond what datetime (or Postgres) can hold --------------------------
FAR = 1_700_000_000_000_000  # 1.7e15 ms: microseconds sent as milliseconds (year 55840)
PG_END_MS = 9_224_318_016_000_000  # 294277-01-01 UTC: the first instant Postgres refuses
PG_START_MS = -210_866_803_200_000  # 4714-11-24 BC, Postgres's first instant


@pytest.mark.parametrize("millis, text_", [
    (FAR, "55840-11-08 22:13:20.000000+00"),
    (PG_END_MS - 1, "294276-12-31 23:59:59.999000+00"),
    (253_402_300_800_000, "10000-01-01 00:00:00.000000+00"),  # datetime's end
    (253_402_300_799_999, "9999-12-31 23:59:59.999000+00"),
    (-62_135_596_800_001, "0001-12-31 23:59:59.999000+00 BC"),  # year 0 is 1 BC
    (PG_START_MS, "4714-11-24 00:00:00.000000+00 BC"),
])
def test_kafka_timestamps_past_datetime_range_are_written_as_postgres_reads_them(millis,
                                                                                  text_):
    # Each text was checked against Postgres 16: SELECT '<text>'::timestamptz (its epoch
    # equals millis / 1000).
    assert kafka_timestamp(millis) == text_


@pytest.mark.parametrize("millis, text_", [
    (-62_135_596_800_000, "0001-01-01 00:00:00.000000+00"),
    (-61_851_600_000_001, "0009-12-31 23:59:59.999000+00"),
    (-59_011_459_200_000, "0100-01-01 00:00:00.000000+00"),
])
def test_kafka_timestamps_of_years_before_1000_keep_four_digits(millis, text_):
    # Postgres reads a two-digit year as the nearest to 2020: "1-01-01" is 2001-01-01.
    assert kafka_timestamp(millis) == text_


def test_a_far_kafka_timestamp_is_stored_and_one_postgres_cannot_hold_is_a_dead_letter():
    good = b'{"order_id": 1, "customer": "c"}'
    records = [Record(0, good, ts=FAR), Record(1, good, ts=PG_END_MS),
               Record(2, good, ts=PG_START_MS - 1), Record(3, good)]
    json_sink = Encoder("json", COLUMNS, 1).encode("t", 0, records)
    raw_sink = Encoder("raw", (), 1).encode("t", 0, records)

    for encoded in (json_sink, raw_sink):
        assert placed(encoded) == {0: "row", 1: "timestamp_out_of_range",
                                   2: "timestamp_out_of_range", 3: "row"}
        # The dead letter keeps the record, its timestamp NULL (Postgres cannot hold it).
        for line in encoded.dead:
            fields = line.rstrip("\n").split("\t")
            assert fields[6] == "\\N" and str(records[int(fields[2])].ts) in fields[8]
    assert json_sink.rows[0].split("\t")[3] == "55840-11-08 22:13:20.000000+00"
    assert struct.unpack(">q", binary_tuple(raw_sink.rows[0])[6])[0] == (
        (FAR - 946_684_800_000) * 1000)


# ---- tombstone keys: one normalisation with the row path ---------------------------------
@pytest.mark.parametrize("kafka_key", [b"42", b"42\n", b" 42\r\n", b"\t42 ", b'"42"',
                                       b' "42"\n', b'{"sku": "42"}', b'{"sku": "42"}\n'])
def test_a_tombstone_names_the_row_its_key_value_was_written_with(kafka_key):
    columns = (("sku", "string", True), ("qty", "long", False))
    encoder = Encoder("json", columns, 1, ("sku",))
    row_key = encoder.encode("t", 0, [Record(0, b'{"sku": "42", "qty": 1}')]).rows[0].split(
        "\t")[4]
    tombstone = encoder.encode("t", 0, [Record(1, None, kafka_key)]).tombstones
    assert tombstone[0].split("\t")[4] == row_key == "42"


def test_inner_whitespace_of_a_bare_string_key_is_kept():
    encoder = Encoder("json", (("sku", "string", True),), 1, ("sku",))
    [line] = encoder.encode("t", 0, [Record(1, None, b" A 17\t\n")]).tombstones
    assert line.split("\t")[4] == "A 17"


# ---- record formats: chosen once, behind one interface -----------------------------------
def test_the_encoder_picks_its_format_once_and_stages_rows_in_its_wire_encoding():
    from pipeline.formats.json.format import JsonFormat
    from pipeline.formats.raw.format import RawFormat
    from pipeline.formats.registry import binary_rows

    json_sink, raw_sink = Encoder("json", COLUMNS, 1), Encoder("raw", (), 1)
    assert type(json_sink.format) is JsonFormat and type(raw_sink.format) is RawFormat
    assert (json_sink.binary, raw_sink.binary) == (False, True) == (binary_rows("json", COLUMNS),
                                                                    binary_rows("raw", ()))
    rows = raw_sink.encode("t", 0, [Record(0, b"a"), Record(1, b"b")]).rows
    assert raw_sink.wire.blob(rows) == b"".join(rows)
    rows = json_sink.encode("t", 0, [Record(0, b'{"order_id": 1, "customer": "\xc3\xa9"}')]).rows
    assert json_sink.wire.blob(rows) == "".join(rows).encode()


class Upper:
    """A new format, as Avro or Protobuf would be one: a module with this class, a line in
    registry.FORMATS. Its value is an ASCII word, stored upper-cased in the one column."""
    from pipeline.formats.wire.text import TEXT as wire

    def __init__(self, columns, run_id):
        self.tail = f"\t{run_id}\n"

    def rows(self, topic, partition, head, records, rejected, refuse):
        rows = []
        for m in records:
            v = m.value()
            if v is None or not v.isalpha():
                rejected.append(m)
            elif v == b"boom":
                raise Boom("format exploded")
            else:
                rows.append(f"{head}{m.offset()}\t{kafka_timestamp(m.timestamp()[1])}\t"
                            f"{v.decode().upper()}{self.tail}")
        return rows

    def explain(self, m):
        return "not_a_word", "value is not an ASCII word"


def test_a_new_format_is_a_class_in_the_registry_with_the_encoders_guarantees(monkeypatch):
    from pipeline.formats import registry

    monkeypatch.setitem(registry.FORMATS, "upper", Upper)
    encoder = Encoder("upper", (("word", "string", True),), 3, ("word",))

    encoded = encoder.encode("t", 0, [Record(0, b"abc"), Record(1, b"a-1"), Record(2, b"boom"),
                                      Record(3, None, b'"k"'), Record(4, None)])

    assert placed(encoded) == {0: "row", 1: "not_a_word", 2: "unexpected_error",
                               3: "tombstone", 4: "bad_tombstone"}
    assert encoded.rows[0].split("\t")[4:] == ["ABC", "3\n"]
    assert encoded.tombstones[0].split("\t")[4:] == ["k", "3", "t\n"]


def test_a_raw_record_postgres_cannot_store_is_unstorable_whatever_its_timestamp():
    far = PG_END_MS  # refused by Postgres too: the header's reason is the one given
    _, dead, _ = Encoder("raw", (), 1).encode("t", 0, [Record(0, b"v", h=[("k\x00", b"x")],
                                                              ts=far)])
    assert [line.split("\t")[7] for line in dead] == ["unstorable"]


def test_a_number_too_large_for_its_decimal_says_so_not_that_its_type_is_wrong():
    _, dead, _ = Encoder("json", COLUMNS, 1).encode("t", 0, [
        Record(0, b'{"order_id": 1, "customer": "c", "amount": 12345678901234567}'),
        Record(1, b'{"order_id": 2, "customer": "c", "amount": "99999999999.995"}')])
    assert [d.split("\t")[7:9] for d in dead] == [
        ["wrong_type", "field 'amount': 12345678901234567 is too large for decimal(12,2) "
                       "(at most 10 digits before the point)\n"],
        ["wrong_type", "field 'amount': 99999999999.995 is too large for decimal(12,2) "
                       "(at most 10 digits before the point)\n"]]
