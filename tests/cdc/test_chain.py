"""The CDC chain for real: the shop's workload against the source Postgres, Debezium's
change events in Kafka as JSON (schema envelope) and as Avro through the registry, with the
transaction metadata the pipeline's source-transaction cuts will be built on; then the
peer, Debezium's JDBC sink, end to end. What these tests pin down is the exact shape of the
events (docs/cdc.md)."""

from __future__ import annotations

import json
import struct
import subprocess
import sys
import urllib.request
from collections import Counter, defaultdict

import psycopg
import pytest

from pipeline.sample_shop_invariants import check, fetch
from tests.cdc.conftest import (
    CONNECT_URL,
    SOURCE_URL,
    TABLES,
    TRANSACTIONS,
    ShopRun,
    tx_of,
    variable_scale_decimal,
)
from tests.helpers import ROOT, TEST_DB_URL
from tests.integration._registry import registry_client

pytestmark = pytest.mark.integration

PLACEHOLDER = "__debezium_unavailable_value"


def payloads(run: ShopRun, table: str) -> list[dict]:
    return [e.json()["payload"] for e in run.json.table(table) if e.value is not None]


def test_the_chain_is_up_and_up_is_idempotent(cdc_chain):
    r = subprocess.run([str(ROOT / "scripts" / "cdc"), "up", "--avro"], capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "source postgres already up" in r.stderr and "connect already up" in r.stderr
    status = subprocess.run([str(ROOT / "scripts" / "stack"), "cdc", "status"],
                            capture_output=True, text=True, check=True).stdout
    assert "pg-source up" in status
    assert "shop-json RUNNING/RUNNING" in status and "shop-avro RUNNING/RUNNING" in status
    with urllib.request.urlopen(f"{CONNECT_URL}/connectors/shop-json/config") as r:
        config = json.load(r)
    assert config["provide.transaction.metadata"] == "true"
    assert config["plugin.name"] == "pgoutput"
    assert config["database.password"].startswith("${dir:")  # the secret stays in a file


def test_up_beside_a_source_transaction_that_altered_a_table_neither_waits_nor_fails(
        cdc_chain):
    """A Connect worker restarted mid-workload (test_chain_kills) is an up while the source
    runs DDL, as the workload's ADD COLUMN: up touches none of the shop's catalog rows, so
    it does not queue behind that transaction (its GRANT ... ON ALL TABLES did, then failed
    with "tuple concurrently updated" when it committed)."""
    with psycopg.connect(SOURCE_URL) as conn:
        conn.execute("ALTER TABLE carts ADD COLUMN up_probe integer")  # open until rollback
        try:
            r = subprocess.run([str(ROOT / "scripts" / "cdc"), "up"], capture_output=True,
                               text=True, timeout=120)
        finally:
            conn.rollback()
    assert r.returncode == 0, r.stderr
    assert "connect already up" in r.stderr


def test_the_workload_keeps_its_invariants_on_the_source(shop_run):
    with psycopg.connect(SOURCE_URL, autocommit=True) as conn:
        assert check(fetch(conn, "public")) == []
    assert shop_run.summary["transactions"] == TRANSACTIONS


def test_every_transaction_has_begin_and_end_counting_its_events_per_table(shop_run):
    tx = [e.json()["payload"] for e in shop_run.json.transactions]
    begins = {tx_of(v["id"]) for v in tx if v["status"] == "BEGIN"}
    ends = {tx_of(v["id"]): v for v in tx if v["status"] == "END"}
    # Each of the run's transactions changes rows (a transaction that changes none, DDL only,
    # is not published at all).
    assert begins == set(ends) and len(ends) >= TRANSACTIONS
    # Group data events by their source transaction: source.txId, which is also the part of
    # transaction.id before ':' (the part after it is each event's own LSN in 3.6).
    seen: dict[str, Counter] = defaultdict(Counter)
    orders: dict[str, list[int]] = defaultdict(list)
    for table in TABLES:
        for p in payloads(shop_run, table):
            tid = tx_of(p["transaction"]["id"])
            assert tid == str(p["source"]["txId"])
            seen[tid][f"public.{table}"] += 1
            orders[tid].append(p["transaction"]["total_order"])
    assert set(seen) == set(ends)
    for tid, end in ends.items():
        counts = {c["data_collection"]: c["event_count"] for c in end["data_collections"]}
        assert counts == dict(seen[tid]), tid
        assert end["event_count"] == sum(counts.values())
        assert sorted(orders[tid]) == list(range(1, end["event_count"] + 1))


def test_an_update_leaving_the_toasted_profile_unchanged_carries_the_placeholder(shop_run):
    created = [e.json()["payload"] for e in shop_run.json.table("customers")
               if e.value is not None and "__debezium.oldkey" not in e.headers]
    created = [p for p in created if p["op"] == "c"]
    assert created and all(len(p["after"]["profile"]) > 8192 for p in created)
    events = payloads(shop_run, "customers")
    renamed = [p for p in events if p["op"] == "u" and p["after"]["profile"] == PLACEHOLDER]
    assert renamed, "no update with the TOAST placeholder"
    assert all(p["before"] is None for p in renamed)  # REPLICA IDENTITY DEFAULT: no before


def test_numeric_without_precision_is_a_variable_scale_decimal(shop_run):
    events = [e.json() for e in shop_run.json.table("accounts") if e.value is not None]
    field = next(f for f in events[0]["schema"]["fields"][1]["fields"] if f["field"] == "balance")
    assert field["name"] == "io.debezium.data.VariableScaleDecimal"
    assert [f["field"] for f in field["fields"]] == ["scale", "value"]
    last = {}
    for v in events:
        p = v["payload"]
        if p["op"] in "cu":
            last[p["after"]["id"]] = variable_scale_decimal(p["after"]["balance"])
    with psycopg.connect(SOURCE_URL) as conn:
        now = dict(conn.execute("SELECT id, balance FROM accounts").fetchall())
    assert now and {a: last[a] for a in now} == now
    assert {b.as_tuple().exponent for b in now.values()} - {-2}  # more scales than one


def test_truncate_is_an_event_without_key_or_images_counted_in_its_transaction(shop_run):
    truncates = [e for e in shop_run.json.table("carts")
                 if e.value is not None and e.json()["payload"]["op"] == "t"]
    assert len(truncates) == 2  # the workload purges the carts twice
    ends = {tx_of(v["id"]): v for v in (e.json()["payload"] for e in shop_run.json.transactions)
            if v["status"] == "END"}
    for e in truncates:
        p = e.json()["payload"]
        assert e.key is None and p["before"] is None and p["after"] is None
        assert p["source"]["table"] == "carts"
        end = ends[str(p["source"]["txId"])]
        assert end["data_collections"] == [{"data_collection": "public.carts", "event_count": 1}]


def test_a_column_added_mid_stream_appears_from_its_transaction_on(shop_run):
    events = [e.json() for e in shop_run.json.table("orders") if e.value is not None]

    def has_channel(v):
        return any(f["field"] == "channel" for f in v["schema"]["fields"][1]["fields"])

    first = next(i for i, v in enumerate(events) if has_channel(v))
    assert first > 0 and not any(has_channel(v) for v in events[:first])
    assert all(has_channel(v) for v in events[first:])
    assert any(v["payload"]["after"] and v["payload"]["after"].get("channel")
               for v in events[first:])


def test_a_primary_key_change_is_a_delete_a_tombstone_and_a_create(shop_run):
    events = shop_run.json.table("customers")
    creates = [i for i, e in enumerate(events) if "__debezium.oldkey" in e.headers]
    assert creates
    i = creates[0]
    delete, tombstone, create = events[i - 2], events[i - 1], events[i]
    old = json.loads(create.headers["__debezium.oldkey"])
    assert delete.json()["payload"]["op"] == "d"
    assert json.loads(delete.key)["payload"] == old == json.loads(tombstone.key)["payload"]
    assert tombstone.value is None
    assert json.loads(delete.headers["__debezium.newkey"]) == json.loads(create.key)["payload"]
    # The new row's TOASTed profile was not rewritten: its create carries the placeholder.
    assert create.json()["payload"]["after"]["profile"] == PLACEHOLDER
    new_id = create.json()["payload"]["after"]["id"]
    tid = create.json()["payload"]["source"]["txId"]
    # The foreign keys cascade it, in the same transaction.
    assert any(p["source"]["txId"] == tid and p["op"] == "u"
               and p["after"]["customer_id"] == new_id for p in payloads(shop_run, "accounts"))


def test_avro_records_are_confluent_wire_format_the_registry_serves(shop_run):
    topics = {t: evs for t, evs in shop_run.avro.events.items() if evs}
    assert len(topics) == len(TABLES) + 1  # the tables and the transaction topic
    ids = set()
    for t, evs in topics.items():
        for e in evs:
            for raw in (e.key, e.value):
                if raw is not None:
                    assert raw[0] == 0, f"{t}@{e.offset}: magic byte {raw[0]}"
                    ids.add(struct.unpack(">I", raw[1:5])[0])
    for schema_id in ids:
        with urllib.request.urlopen(f"{shop_run.registry_url}/schemas/ids/{schema_id}",
                                    timeout=20) as r:
            assert json.load(r)["schema"]
    # Decoded by confluent-kafka's AvroDeserializer (the writer schema fetched by id), the
    # Avro stream is the JSON one: the same operations of the same transactions.
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    de = AvroDeserializer(registry_client(shop_run.registry_url))
    for table in TABLES:
        avro = [de(e.value, SerializationContext(e.topic, MessageField.VALUE))
                for e in shop_run.avro.table(table) if e.value is not None]
        as_json = payloads(shop_run, table)

        def shape(p):
            return (p["op"], p["source"]["txId"], (p["after"] or {}).get("id"))

        assert [shape(p) for p in avro] == [shape(p) for p in as_json], table
    balance = next(p["after"]["balance"] for p in (
        de(e.value, SerializationContext(e.topic, MessageField.VALUE))
        for e in shop_run.avro.table("accounts") if e.value is not None) if p["after"])
    assert set(balance) == {"scale", "value"}  # VariableScaleDecimal: a record here too


def test_debezium_jdbc_sink_peer_end_to_end(shop_run):
    """The peer consumes every data topic to its end, the invariant reader watches its
    replica meanwhile, and the replica is compared with the source row by row."""
    r = subprocess.run([sys.executable, "-m", "bench.peers.debezium_jdbc",
                        "--replica", TEST_DB_URL, "--schema", "peer_debezium_test",
                        "--connect", CONNECT_URL, "--source", SOURCE_URL,
                        "--timeout", str(600 + TRANSACTIONS / 10)],
                       capture_output=True, text=True, cwd=ROOT, timeout=900 + TRANSACTIONS / 10)
    assert r.returncode == 0, r.stderr[-3000:]
    report = json.loads(r.stdout)
    events = sum(1 for t in TABLES for _ in shop_run.json.table(t))
    assert report["events"] == events and report["topics"] == len(TABLES)
    assert report["events_per_second"] > 0 and report["reader"]["polls"] >= 1
    assert report["torn_polls"] == report["reader"]["broken_polls"]
    tables = report["compare"]["tables"]
    assert set(tables) == set(TABLES)
    # Its one difference: the profiles of customers updated without them hold Debezium's
    # placeholder instead (the sink writes what the event carries).
    assert all(tables[t]["equal"] for t in TABLES if t != "customers"), tables
    customers = tables["customers"]
    assert customers["columns"] == {"profile": customers["differing"]} != {}
    assert all(PLACEHOLDER in line for line in customers["first"])
