"""Whole source transactions on the driver: [sink] transactions in the settings, and the
transaction topic's events as plan/transactions.TransactionEnd values (JSON with and
without Kafka Connect's schema envelope, Avro's decoded record); no Kafka."""

from __future__ import annotations

import pytest

from pipeline.config import parse_settings
from pipeline.errors import ConfigError

DEBEZIUM = {"envelope": "debezium", "mode": "upsert", "key": ["id"]}


def settings(topics=("shop.public.orders",), **sink):
    return parse_settings({
        "pipeline": {"name": "p"},
        "kafka": {"bootstrap_servers": "h:9092", "topics": list(topics)},
        "database": {"url": "postgresql://u:pw@h/db"},
        "sink": {"format": "json", "table": "t", "columns": {"id": "long"}, **sink}},
        environ={})


def test_transactions_names_debeziums_transaction_topic():
    assert settings(**DEBEZIUM, transactions="shop.transaction").sink.transactions == \
        "shop.transaction"
    assert settings(**DEBEZIUM).sink.transactions is None
    for sink, topics, why in (
            ({"mode": "upsert", "key": ["id"]}, (), "only for sink.envelope = 'debezium'"),
            (DEBEZIUM, (), "is not a Kafka topic name"),
            (DEBEZIUM, ("shop.transaction",), "is also one of the pipeline.s topics")):
        with pytest.raises(ConfigError, match=why):
            settings(topics=("shop.public.orders", *topics), **sink,
                     transactions="shop.transaction" if "name" not in why else "a b")


def test_transaction_events_are_ends_by_their_txid_begins_none_anything_else_exit_3():
    from pipeline.driver.transaction_topic import parse_event
    from pipeline.errors import DataError
    from pipeline.plan.transactions import TransactionEnd

    end = {"status": "END", "id": "742:26769792", "event_count": 3, "data_collections": [
        {"data_collection": "public.orders", "event_count": 1},
        {"data_collection": "public.order_lines", "event_count": 2}]}
    want = TransactionEnd("742", 9, {"public.orders": 1, "public.order_lines": 2})
    assert parse_event(end, "shop.transaction", 9) == want
    # Kafka Connect's JSON with schemas, and an Avro record decoded: the same payload.
    assert parse_event({"schema": {}, "payload": end}, "shop.transaction", 9) == want
    assert parse_event({"status": "BEGIN", "id": "742:1", "event_count": None,
                        "data_collections": None}, "shop.transaction", 8) is None
    with pytest.raises(DataError, match=r"shop.transaction\[0\] offset 5 is not a Debezium "
                                        "transaction event"):
        parse_event({"id": 1, "after": {}}, "shop.transaction", 5)


def test_a_cut_run_moves_each_offset_to_its_cut_and_the_transaction_topic_past_its_ends():
    from pipeline.driver.transaction_cut import RunCut
    from pipeline.driver.transaction_topic import TransactionTopicRead
    from pipeline.plan.offsets import OffsetRange, PlannedPartition
    from pipeline.plan.transactions import TransactionCut

    orders, lines = OffsetRange("s.public.orders", 0, 10, 20), OffsetRange("s.public.lines",
                                                                           0, 5, 9)
    metadata = TransactionTopicRead("s.transaction", 30, 30, 40, ())
    cut = RunCut(TransactionCut({orders.tp: 14, lines.tp: 9}, ("1",), 36), metadata, {},
                 [orders, lines])
    updates = cut.offset_updates([PlannedPartition(orders, 10), PlannedPartition(lines, 5)])
    assert [(u.range, u.stored) for u in updates] == [
        (OffsetRange("s.public.orders", 0, 10, 14), 10), (lines, 5),
        (OffsetRange("s.transaction", 0, 30, 36), 30)]
    assert cut.cut_short() == {orders.tp: OffsetRange("s.public.orders", 0, 10, 14)}
    # Nothing passed: the transaction topic's offset stays, a range cut at its start too.
    still = RunCut(TransactionCut({orders.tp: 10, lines.tp: 5}, (), None), metadata, {},
                   [orders, lines])
    assert still.offset_updates([PlannedPartition(orders, 10),
                                 PlannedPartition(lines, 5)]) == []
    assert still.summary()["metadata"] == {"from": 30, "until": 30, "latest": 40}


def test_the_cut_keeps_the_ends_read_ahead_only_where_its_read_starts_where_theirs_did():
    """driver/transaction_prefetch.py reads the transaction topic during the data's read;
    the cut's read keeps those ENDs and reads only what came after them, unless its own
    start is another (an offset stored meanwhile, ENDs lost and skipped), the topic's end
    went back, or there is no read ahead: then it reads everything itself."""
    from pipeline.driver.transaction_topic import TransactionTopicRead, continued
    from pipeline.plan.transactions import TransactionEnd

    def end(offset: int) -> TransactionEnd:
        return TransactionEnd(str(offset), offset, {"public.orders": 1})

    asked = []

    def read(a: int, b: int):
        asked.append((a, b))
        return [end(o) for o in range(a, b) if o % 2]

    ahead = TransactionTopicRead("s.transaction", 30, 30, 36, (end(31), end(33), end(35)))
    assert continued(ahead, 30, 30, 40, read) == (
        (end(31), end(33), end(35), end(37), end(39)), 36)
    assert asked == [(36, 40)]
    # Nothing new since: an empty tail, nothing read twice.
    assert continued(ahead, 30, 30, 36, read) == ((end(31), end(33), end(35)), 36)
    whole = (tuple(end(o) for o in range(30, 40) if o % 2), 30)
    for stored, start, latest in ((32, 32, 40),  # an offset stored since
                                  (30, 31, 40),  # ENDs lost to retention, skipped
                                  (30, 30, 34)):  # the topic's end went back
        asked.clear()
        assert continued(ahead, stored, start, latest, read)[1] == start
        assert asked == [(start, latest)]
    assert continued(None, 30, 30, 40, read) == whole
    # A first run (nothing stored) reads from the earliest offset both times.
    first = TransactionTopicRead("s.transaction", None, 0, 2, (end(1),))
    assert continued(first, None, 0, 4, read) == ((end(1), end(3)), 2)
    assert continued(first, 0, 0, 4, read)[1] == 0  # stored meanwhile: read again


def test_a_transaction_events_payload_is_parsed_alone_as_the_whole_value_would_read_it():
    """The schema envelope's schema (most of an event's bytes, the same for every event)
    is parsed once, only the payload of each event: what the whole value's parse gives,
    and garbage fails as it did (the payload of a value that is not one JSON text is not
    taken alone, an envelope inside the payload is not unwrapped)."""
    import json

    import orjson

    from pipeline.driver.transaction_topic import _payloads, _unwrapped

    schema = {"type": "struct", "fields": [{"field": "status", "type": "string"}],
              "name": "io.debezium.connector.common.TransactionMetadataValue"}
    begin = {"status": "BEGIN", "id": "742:1", "event_count": None, "data_collections": None}
    end = {"status": "END", "id": "742:2", "event_count": 1, "data_collections": [
        {"data_collection": "public.orders", "event_count": 1}]}
    good = [json.dumps({"schema": schema, "payload": p}, separators=(",", ":")).encode()
            for p in (begin, end)] + [json.dumps({"schema": schema, "payload": end}).encode(),
                                      json.dumps(end).encode()]
    nested = json.dumps({"schema": schema, "payload": {"schema": {}, "payload": end}},
                        separators=(",", ":")).encode()
    bad = [b'{"schema":{"type":"struct"},"payload":{"status":"END",}}',  # payload broken
           b'{"schema":{"type":"struct","payload":1},"payload":{}}',  # split inside S
           b'{"schema":{"type":"struct"},"payload":{}}}',  # a brace too many
           b'{"schema":[1,],"payload":{"status":"BEGIN"}}',  # the schema broken
           b'{"schema":1,"payload":2,"payload":3}']  # a payload that is no JSON alone
    decode = _payloads(settings(**DEBEZIUM, transactions="shop.transaction"))
    for value in [*good, nested, *bad] * 2:  # the second time by the schemas kept
        try:
            want = _unwrapped(orjson.loads(value))
        except ValueError:
            with pytest.raises(ValueError):
                decode(value)
        else:
            assert decode(value) == want, value
    assert decode(nested) == {"schema": {}, "payload": end}
