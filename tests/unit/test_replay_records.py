"""The pure parts of a dead-letter replay (driver/replay_records.py): a stored dead letter is
the record it was, and re-decoding it gives the executors' rows and dead letters."""

from __future__ import annotations

import base64
import json

from pipeline.driver.replay_records import (
    StoredRecord,
    dead_offset,
    decode,
    headers_from_json,
    refusal,
)
from pipeline.executor.task import EncoderSettings
from pipeline.formats.wire.text import headers_escaped, headers_plain
from pipeline.store.dead_letters import DeadLetterFilter
from tests.helpers import make_settings

HEADERS = [("bin", bytes(range(256))), ("empty", b""), ("none", None), ("é", b"\xc3\xa9")]


def test_headers_read_back_as_the_record_had_them():
    assert headers_from_json(json.loads(headers_plain(HEADERS))) == HEADERS
    escaped = json.loads(headers_escaped([("a\x00b", b"v"), ("n", None)]))
    assert headers_from_json(escaped) == [("a\x00b", b"v"), ("n", None)]
    assert headers_from_json([]) is None and headers_from_json(None) is None


def row(offset: int, value: bytes | None, ms: int | None = 1_700_000_000_123,
        error=("wrong_type", "old reason")):
    return ("orders", 3, offset, memoryview(b"k"), value,
            [{"key": "h", "value_b64": base64.b64encode(b"x").decode()}], ms, *error)


def test_a_stored_record_has_a_kafka_messages_methods():
    m = StoredRecord(row(7, b"{}"))
    assert (m.offset(), m.key(), m.value(), m.headers(), m.timestamp()[1]) == (
        7, b"k", b"{}", [("h", b"x")], 1_700_000_000_123)


def encoder(qty: str = "double"):
    return EncoderSettings("json", (("order_id", "long", True), ("qty", qty, False)),
                           99).encoder()


def test_decode_gives_the_rows_and_the_dead_letters_that_still_fail():
    rows = [row(1, b'{"order_id": 1, "qty": 2.5}'), row(2, b'{"order_id": 2, "qty": "x"}'),
            row(3, b"{bad"), row(4, b'{"order_id": 4}', ms=None, error=(
                "timestamp_out_of_range", "Kafka timestamp 1e18 ms is outside"))]
    d = decode(encoder(), "orders", 3, rows)
    assert d.replayed == [1] and d.failing == [2, 3, 4]
    assert len(d.rows) == 1 and d.rows[0].startswith("orders\t3\t1\t2023-11-14 22:13:20.123")
    assert d.rows[0].rstrip("\n").endswith("\t1\t2.5\t99")
    assert [dead_offset(x) for x in d.dead] == [2, 3, 4]
    types = {dead_offset(x): x.split("\t")[7] for x in d.dead}
    assert types == {2: "wrong_type", 3: "malformed_json", 4: "timestamp_out_of_range"}
    kept = next(x for x in d.dead if dead_offset(x) == 4).rstrip("\n").split("\t")
    assert kept[6] == "\\N" and kept[8] == "Kafka timestamp 1e18 ms is outside"  # as stored


def test_dead_offset_survives_an_escaped_tab_in_the_topic():
    assert dead_offset("a\\tb\t0\t42\t\\N\t\\N\t[]\t\\N\tx\ty\n") == 42


def test_a_transform_sink_is_refused_and_told_what_to_do_instead():
    plain = make_settings("p", ["t"])
    assert refusal(plain) is None
    transform = make_settings("p", ["t"], sink={"transform": "m:f"})
    why = refusal(transform)
    assert "transform" in why and "'m:f'" in why and "backfill --reprocess" in why


def test_a_filter_names_only_what_was_given():
    f = DeadLetterFilter(error_type="wrong_type", partition=0, from_offset=5)
    assert f.as_dict() == {"error_type": "wrong_type", "partition": 0, "from_offset": 5}
    _, params = f.where("p")
    assert params == ["p", "wrong_type", 0, 5]
