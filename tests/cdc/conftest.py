"""The real CDC chain (scripts/cdc): a source Postgres with the sample shop, Kafka Connect
with Debezium's Postgres connector writing JSON (shop_json.*) and Avro through the stack's
Schema Registry (shop_avro.*). Made fresh once per session (scripts/cdc reset, then up),
then one short run of the shop's workload whose change events the tests read."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import time
from collections import defaultdict
from dataclasses import dataclass, field
from decimal import Decimal

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline.sample_shop import run_workload
from tests.helpers import BOOTSTRAP, ROOT, admin
from tests.integration._registry import registry_client

SOURCE_URL = (f"postgresql://postgres@127.0.0.1:{os.environ.get('PG_SOURCE_PORT', '5434')}"
              "/shop")
CONNECT_URL = f"http://127.0.0.1:{os.environ.get('CONNECT_PORT', '8083')}"
TABLES = ("customers", "accounts", "orders", "order_lines", "carts")
# Every fixed case of the workload happens even in a short run (sample_shop_workload.SCHEDULE);
# CDC_TEST_TRANSACTIONS=10000 runs the same tests on the workload's full form.
TRANSACTIONS = int(os.environ.get("CDC_TEST_TRANSACTIONS", "120"))
SEED = 41


@dataclass
class Event:
    topic: str
    offset: int
    key: bytes | None
    value: bytes | None
    headers: dict[str, bytes]

    def json(self) -> dict | None:
        return json.loads(self.value) if self.value is not None else None


@dataclass
class Stream:
    """One connector's events of the workload's run: per topic, in offset order."""

    prefix: str
    events: dict[str, list[Event]] = field(default_factory=lambda: defaultdict(list))

    def table(self, name: str) -> list[Event]:
        return self.events[f"{self.prefix}.public.{name}"]

    @property
    def transactions(self) -> list[Event]:
        return self.events[f"{self.prefix}.transaction"]


@dataclass
class ShopRun:
    summary: dict
    json: Stream
    avro: Stream
    registry_url: str


def variable_scale_decimal(v: dict) -> Decimal:
    """Debezium's VariableScaleDecimal in JSON: the unscaled value's two's-complement bytes,
    base64, and its scale."""
    unscaled = int.from_bytes(base64.b64decode(v["value"]), "big", signed=True)
    return Decimal(unscaled).scaleb(-v["scale"])


def tx_of(event_id: str) -> str:
    """The source transaction of a Debezium 3.6 transaction id '<txId>:<lsn>' (the LSN part
    is each event's own: it differs within one transaction)."""
    return event_id.split(":")[0]


def topic_ends(prefix: str) -> dict[str, int]:
    md = admin().list_topics(timeout=10)
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "cdc-tests"})
    try:
        return {t: c.get_watermark_offsets(TopicPartition(t, 0), timeout=10)[1]
                for t in md.topics if t.startswith(f"{prefix}.")}
    finally:
        c.close()


def read(topic: str, start: int, end: int) -> list[Event]:
    c = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": "cdc-tests",
                  "enable.auto.commit": False})
    try:
        c.assign([TopicPartition(topic, 0, start)])
        out: list[Event] = []
        deadline = time.monotonic() + 60
        while (not out or out[-1].offset < end - 1) and end > start:
            assert time.monotonic() < deadline, f"{topic} did not give offsets {start}..{end}"
            m = c.poll(1)
            if m is None or m.error():
                continue
            out.append(Event(topic, m.offset(), m.key(), m.value(), dict(m.headers() or [])))
        return out
    finally:
        c.close()


def collect(prefix: str, starts: dict[str, int], last_txid: int, decode) -> Stream:
    """Waits until the END of the run's last transaction is in <prefix>.transaction and every
    END's events are in the data topics, then returns the run's events."""
    wait = 120 + TRANSACTIONS / 50
    deadline = time.monotonic() + wait
    while True:
        ends = topic_ends(prefix)
        s = Stream(prefix)
        for t, end in ends.items():
            s.events[t] = read(t, starts.get(t, 0), end)
        done = [decode(e) for e in s.transactions]
        last = any(v["status"] == "END" and tx_of(v["id"]) == str(last_txid) for v in done)
        expected = sum(v["event_count"] for v in done if v["status"] == "END")
        have = sum(1 for t, evs in s.events.items() if ".public." in t
                   for e in evs if e.value is not None)
        if last and have >= expected:
            return s
        assert time.monotonic() < deadline, (
            f"{prefix}: the run's events did not all arrive within {wait:.0f} s (last END seen: "
            f"{last}; {have} of {expected} data events): see .stack/connect/connect.log")
        time.sleep(1)


@pytest.fixture(scope="session")
def cdc_chain(registry) -> str:
    """A fresh chain: what earlier sessions left (connectors, offsets, slots, topics, the
    shop) deleted, then everything started and registered; the registry's URL."""
    for args in (["reset"], ["up", "--avro"]):
        subprocess.run([str(ROOT / "scripts" / "cdc"), *args], check=True, timeout=900)
    return registry


@pytest.fixture(scope="session")
def shop_run(cdc_chain) -> ShopRun:
    from confluent_kafka.schema_registry.avro import AvroDeserializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    starts = {**topic_ends("shop_json"), **topic_ends("shop_avro")}
    summary = run_workload(SOURCE_URL, TRANSACTIONS, SEED)
    deserialize = AvroDeserializer(registry_client(cdc_chain))

    def avro_value(e: Event) -> dict:
        return deserialize(e.value, SerializationContext(e.topic, MessageField.VALUE))

    return ShopRun(summary,
                   collect("shop_json", starts, summary["last_txid"],
                           lambda e: e.json()["payload"]),
                   collect("shop_avro", starts, summary["last_txid"], avro_value),
                   cdc_chain)
