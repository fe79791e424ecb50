"""Debezium change events ([sink] envelope = "debezium"): what each op becomes (a row of
the after image, a deletion of the key), with and without Kafka Connect's schema envelope,
Debezium's date/timestamp/decimal encodings, and the config's rules; no Kafka, no Spark."""

import base64
import json

import pytest

from pipeline.config import parse_settings
from pipeline.errors import ConfigError
from pipeline.formats.debezium import old_key
from pipeline.formats.encode import Encoder
from tests.unit.test_encode import Record

COLUMNS = (("id", "long", True), ("name", "string", False), ("city", "string", False,
                                                              ("address", "city")))


def event(op, after=None, before=None, schema=None):
    payload = {"before": before, "after": after, "op": op, "source": {"db": "shop"},
               "ts_ms": 1}
    doc = payload if schema is None else {"schema": schema, "payload": payload}
    return json.dumps(doc).encode()


def encode(records, columns=COLUMNS):
    return Encoder("debezium", columns, 1, tombstone_key=("id",)).encode("t", 0, records)


def test_creates_reads_and_updates_are_rows_of_the_after_image_deletes_delete_the_key():
    out = encode([
        Record(0, event("c", {"id": 1, "name": "a", "address": {"city": "X"}}), k=b'{"id":1}'),
        Record(1, event("r", {"id": 2, "name": "b"}), k=b'{"id":2}'),
        Record(2, event("u", {"id": 1, "name": "a2"}, {"id": 1}), k=b'{"id":1}'),
        Record(3, event("d", None, {"id": 2, "name": "b"}), k=b'{"id":2}'),
        Record(4, None, k=b'{"id":2}'),  # the tombstone after the delete
        Record(5, event("d", None, {"id": 7}), k=None),  # no Kafka key: the before image
        # A before image without the key: the Kafka key, out of its schema envelope.
        Record(6, event("d", None, {"name": "b"}),
               k=json.dumps({"schema": {"type": "struct"}, "payload": {"id": 9}}).encode()),
        # A before image with the key: it names the row (the image the create wrote).
        Record(7, event("d", None, {"id": 8}), k=b'{"id":9}'),
    ])
    # Then the columns the change left out: none (NULL).
    assert [line.split("\t")[4:-2] for line in out.rows] == [
        ["1", "a", "X", "\\N"], ["2", "b", "\\N", "\\N"], ["1", "a2", "\\N", "\\N"]]
    assert [(line.split("\t")[2], line.split("\t")[4]) for line in out.tombstones] == [
        ("3", "2"), ("4", "2"), ("5", "7"), ("6", "9"), ("7", "8")]
    assert out.dead == []


def test_bad_events_are_dead_letters_naming_why():
    out = encode([
        Record(0, event("t")),
        Record(1, b'{"id": 1}'),
        Record(2, event("c", {"id": "one"})),
        Record(3, event("u", None)),
        Record(4, b"not json"),
        Record(5, event("d", None, None), k=None),
    ])
    dead = {int(f[2]): (f[7], f[8].rstrip("\n")) for f in (d.split("\t") for d in out.dead)}
    assert dead == {
        0: ("unsupported_op", "op 't' is not a row change this sink applies (c, r, u upsert; d "
                              "deletes; t empties the table with [sink] truncate = \"apply\")"),
        1: ("not_a_change_event", "value is not a Debezium change event (no 'op'; with the "
                                  "schema envelope, no 'payload.op')"),
        2: ("wrong_type", "field 'id': expected long, got string"),
        3: ("not_a_change_event", "op 'u' without an 'after' image"),
        4: ("malformed_json", "value is not valid JSON"),
        5: ("bad_tombstone", "delete has no Kafka key: it cannot name the row to delete"),
    }
    assert out.rows == [] and out.tombstones == []


def test_the_schema_envelope_decodes_debeziums_dates_timestamps_and_decimals():
    fields = [{"field": "id", "type": "int64"},
              {"field": "at_ms", "type": "int64", "name": "io.debezium.time.Timestamp"},
              {"field": "at_us", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
              {"field": "day", "type": "int32", "name": "io.debezium.time.Date"},
              {"field": "price", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
               "parameters": {"scale": "2"}}]
    schema = {"type": "struct", "fields": [{"field": "before", "type": "struct",
                                            "fields": fields},
                                           {"field": "after", "type": "struct",
                                            "fields": fields}]}
    price = base64.b64encode((-12345).to_bytes(2, "big", signed=True)).decode()
    after = {"id": 1, "at_ms": 1_700_000_000_123, "at_us": -1, "day": 19_000, "price": price}
    columns = (("id", "long", True), ("at_ms", "timestamp", False),
               ("at_us", "timestamp", False), ("day", "date", False),
               ("price", "decimal(8,2)", False))
    out = encode([Record(0, event("c", after, schema=schema), k=b"1")], columns)
    assert out.dead == []
    assert out.rows[0].split("\t")[4:-3] == [
        "1", "2023-11-14T22:13:20.123000+00:00", "1969-12-31T23:59:59.999999+00:00",
        "2022-01-08", "-123.45"]


def settings(**sink):
    return parse_settings({
        "pipeline": {"name": "p"}, "kafka": {"bootstrap_servers": "h:9092", "topics": ["t"]},
        "database": {"url": "postgresql://u:pw@h/db"},
        "sink": {"format": "json", "table": "t", "columns": {"id": "long"}, **sink}},
        environ={})


def test_the_envelope_needs_a_json_upsert_that_deletes():
    s = settings(envelope="debezium", mode="upsert", key=["id"]).sink
    assert (s.envelope, s.record_format, settings().sink.record_format) == (
        "debezium", "debezium", "json")
    for sink, why in (({}, "needs sink.mode = 'upsert'"),
                      ({"mode": "upsert", "key": ["id"], "tombstones": "dead_letter"},
                       "needs sink.mode = 'upsert'"),
                      ({"envelope": "maxwell"}, "must be one of none, debezium")):
        with pytest.raises(ConfigError, match=why):
            settings(**{"envelope": "debezium", **sink})


def test_the_example_config_reads_change_events():
    from pipeline.config import load_settings

    s = load_settings("conf/examples/debezium.toml", environ={}).sink
    assert (s.record_format, s.mode, s.key, s.deletes) == ("debezium", "upsert", ("id",), True)


def _enveloped(fields, payload):
    return json.dumps({"schema": {"type": "struct", "fields": fields},
                       "payload": payload}).encode()


@pytest.mark.parametrize("semantic, column, raw, decoded", [
    ({"type": "int32", "name": "io.debezium.time.Date"}, "date", 19_000, "2022-01-08"),
    ({"type": "int64", "name": "io.debezium.time.Timestamp"}, "timestamp", 1_700_000_000_123,
     "2023-11-14T22:13:20.123000+00:00"),
    ({"type": "int64", "name": "io.debezium.time.MicroTimestamp"}, "timestamp",
     1_700_000_000_123_456, "2023-11-14T22:13:20.123456+00:00"),
    ({"type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
      "parameters": {"scale": "2"}}, "decimal(8,2)",
     base64.b64encode((-12345).to_bytes(2, "big", signed=True)).decode(), "-123.45"),
])
def test_deletes_and_tombstones_of_a_schema_enveloped_key_name_the_row_its_create_wrote(
        semantic, column, raw, decoded):
    # The Kafka key carries its own schema: it is decoded as the value images are, so
    # the delete (by its before image, or by the key) and the tombstone name the created row.
    key_schema = [{"field": "k", **semantic}]
    image = key_schema + [{"field": "n", "type": "string"}]
    schema = {"type": "struct", "fields": [{"field": "before", "type": "struct",
                                            "fields": image},
                                           {"field": "after", "type": "struct",
                                            "fields": image}]}
    key = _enveloped(key_schema, {"k": raw})
    out = Encoder("debezium", (("k", column, True), ("n", "string", False)), 1,
                  tombstone_key=("k",)).encode("t", 0, [
        Record(0, event("c", {"k": raw, "n": "x"}, schema=schema), k=key),
        Record(1, event("d", None, {"k": raw, "n": "x"}, schema=schema), k=key),
        Record(2, event("d", None, {"n": "x"}, schema=schema), k=key),  # key not in before
        Record(3, None, k=key)])
    assert out.dead == []
    assert out.rows[0].split("\t")[4] == decoded
    assert [line.split("\t")[4] for line in out.tombstones] == [decoded] * 3


# ---- change events as real sources send them ---------------------------------------------
UNAVAILABLE = "__debezium_unavailable_value"


def test_a_placeholder_of_an_unchanged_toasted_value_is_null_and_named():
    """The string, a bytea column's bytes (base64), an array's one element, a column read
    under one: NULL in the row, named in ``_unavailable`` (before the old key's and run_id: the
    merge keeps the stored values), even for a 'not null' column; a key column is never
    unavailable (its placeholder is a wrong type)."""
    columns = (("id", "long", True), ("note", "string", True), ("blob", "string", False),
               ("tags", "array<string>", False), ("city", "string", False,
                                                   ("address", "city")),
               ("name", "string", False))
    blob = base64.b64encode(UNAVAILABLE.encode()).decode()
    out = encode([
        Record(0, event("u", {"id": 1, "note": UNAVAILABLE, "blob": blob, "tags": [UNAVAILABLE],
                              "address": UNAVAILABLE, "name": "a"}), k=b"1"),
        Record(1, event("u", {"id": 2, "note": "n", "blob": blob, "name": "b"}), k=b"2"),
        Record(2, event("u", {"id": 3, "note": "n", "name": UNAVAILABLE + "!"}), k=b"3"),
        Record(3, event("u", {"id": UNAVAILABLE, "note": "n"}), k=b"4"),
    ], columns)
    assert sorted(line.split("\t")[4:-2] for line in out.rows) == [
        ["1", "\\N", "\\N", "\\N", "\\N", "a", "{note,blob,tags,city}"],
        ["2", "n", "\\N", "\\N", "\\N", "b", "{blob}"],
        ["3", "n", "\\N", "\\N", "\\N", f"{UNAVAILABLE}!", "\\N"]]
    assert [d.split("\t")[7] for d in out.dead] == ["wrong_type"]


def test_a_truncate_deletes_every_key_when_applied_else_is_a_dead_letter():
    truncate = event("t")
    applied = Encoder("debezium", COLUMNS, 1, tombstone_key=("id",), truncate=True).encode(
        "t", 0, [Record(5, truncate, k=None)])
    assert applied.rows == [] and applied.dead == []
    assert [line.split("\t")[2:] for line in applied.tombstones] == [
        ["5", "2023-11-14 22:13:20.123000+00", "\\N", "1", "t\n"]]
    assert [d.split("\t")[7] for d in encode([Record(5, truncate, k=None)]).dead] == [
        "unsupported_op"]


def test_variable_scale_decimals_are_decoded_by_their_schema_or_their_shape():
    vsd = {"field": "amount", "type": "struct", "name": "io.debezium.data.VariableScaleDecimal",
           "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}]}
    fields = [{"field": "id", "type": "int64"}, vsd]
    schema = {"type": "struct", "fields": [{"field": "after", "type": "struct",
                                            "fields": fields}]}

    def amount(unscaled: int, scale: int) -> dict:
        return {"scale": scale, "value": base64.b64encode(
            unscaled.to_bytes(8, "big", signed=True)).decode()}

    columns = (("id", "long", True), ("amount", "decimal(20,4)", False))
    out = encode([
        Record(0, event("c", {"id": 1, "amount": amount(-12345, 2)}, schema=schema), k=b"1"),
        Record(1, event("c", {"id": 2, "amount": amount(5, 1)}), k=b"2"),  # no schema
        Record(2, event("c", {"id": 3, "amount": amount(123456789, 7)}), k=b"3"),
        Record(3, event("c", {"id": 4, "amount": amount(10**17, 0)}, schema=schema), k=b"4"),
    ], columns)
    assert [line.split("\t")[4:6] for line in out.rows] == [
        ["1", "-123.4500"], ["2", "0.5000"], ["3", "12.3457"]]
    assert [d.split("\t")[7:9] for d in out.dead] == [
        ["wrong_type", "field 'amount': 100000000000000000 is too large for decimal(20,4) "
                       "(at most 16 digits before the point)\n"]]


def test_truncate_is_only_for_the_debezium_envelope():
    dbz = {"envelope": "debezium", "mode": "upsert", "key": ["id"]}
    assert settings(**dbz, truncate="apply").sink.truncate == "apply"
    assert settings(**dbz).sink.truncate == "dead_letter"
    with pytest.raises(ConfigError, match="'sink.truncate' is only for sink.envelope"):
        settings(mode="upsert", key=["id"], truncate="apply")


# ---- each change's source transaction ([sink] transactions) ----------------------------
def sourced(op, after=None, before=None, *, lsn, tx=None, table_order=1):
    """An event as Debezium 3.6 writes it: a transaction block whose id's part after ':' is
    the event's own LSN."""
    payload = {"before": before, "after": after, "op": op, "ts_ms": 1,
               "source": {"db": "shop", "txId": tx, "lsn": lsn},
               "transaction": None if tx is None else {
                   "id": f"{tx}:{lsn}", "total_order": table_order,
                   "data_collection_order": table_order}}
    return json.dumps({"schema": {"type": "struct", "fields": []}, "payload": payload}).encode()


def test_transactions_names_each_records_source_transaction_and_order_in_its_table():
    encoder = Encoder("debezium", COLUMNS, 1, tombstone_key=("id",))
    records = [Record(0, sourced("r", {"id": 1}, lsn=100), k=b"1"),
               Record(1, sourced("c", {"id": 2}, lsn=300, tx=742, table_order=1), k=b"2"),
               Record(2, sourced("d", None, {"id": 2}, lsn=310, tx=742, table_order=2), k=b"2"),
               Record(3, None, k=b"2"),
               Record(4, b"not json"),
               Record(5, sourced("c", {"id": "x"}, lsn=320, tx=743), k=b"3")]
    encoded, sources = encoder.transactions("t", 0, records)
    # A snapshot's read, a tombstone and what is no change event have none; a change that
    # is a dead letter for its columns still counts in its transaction (its END counts it).
    assert sources == [None, ("742", 1), ("742", 2), None, None, ("743", 1)]
    assert len(encoded.rows) == 2 and len(encoded.tombstones) == 2 and len(encoded.dead) == 2
    assert encoder.format.sources is None  # encode() collects nothing
    assert encoder.encode("t", 0, records) == encoded


def test_a_primary_key_changes_create_that_left_a_column_out_carries_its_old_key():
    """Debezium's create of the new key (header ``__debezium.oldkey``: the old Kafka key,
    here in the schema envelope) stages the old key after ``_unavailable``, typed as the key,
    for the merge to find the value under; a create that left nothing out, or has no such
    header, carries none (NULL); a header that names no key makes the create a dead letter
    naming it."""
    key = json.dumps({"schema": {"type": "struct", "fields": [
        {"field": "id", "type": "int64"}]}, "payload": {"id": 21}}).encode()
    oldkey = [("__debezium.oldkey", key)]
    out = encode([
        Record(0, event("c", {"id": 1021, "name": UNAVAILABLE}), k=b"1021", h=oldkey),
        Record(1, event("c", {"id": 1022, "name": "b"}), k=b"1022", h=oldkey),
        Record(2, event("c", {"id": 1023, "name": UNAVAILABLE}), k=b"1023"),
        Record(3, event("c", {"id": 1024, "name": UNAVAILABLE}), k=b"1024",
               h=[("__debezium.oldkey", b'{"other": 1}')]),
    ])
    assert sorted(line.rstrip("\n").split("\t")[4:] for line in out.rows) == [
        ["1021", "\\N", "\\N", "{name}", "21", "1"],
        ["1022", "b", "\\N", "\\N", "\\N", "1"],
        ["1023", "\\N", "\\N", "{name}", "\\N", "1"]]
    [dead] = out.dead
    assert dead.split("\t")[2] == "3" and dead.rstrip("\n").split("\t")[7:9] == [
        "bad_old_key", "the create of a primary-key change that left a column out: its "
        "__debezium.oldkey header cannot name the old key (it has a Kafka key without 'id'), "
        "so the value it had under the old key cannot be found"]


def test_the_old_key_header_is_the_records_last_of_that_name():
    assert old_key.header(Record(0, None)) is None
    assert old_key.header(Record(0, None, h=[("__debezium.oldkey", b"1"), ("x", b"2"),
                                             ("__debezium.oldkey", b"3")])) == b"3"
