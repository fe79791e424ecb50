"""Helpers for the tests of the upsert and aggregate sinks (sink modes, transforms, kills,
partition growth, verify): the orders they produce, what Kafka holds, the state each sink
must hold recomputed from it apart from pipeline/sinks/, the tables as they are, and the
pipelines these tests make."""

from __future__ import annotations

import json
import signal
from collections import defaultdict
from collections.abc import Callable
from decimal import Decimal

from confluent_kafka import Consumer, TopicPartition

from pipeline.driver.job import run_ingest
from tests.helpers import (
    BOOTSTRAP,
    init_cli,
    init_db,
    make_settings,
    produce,
    query,
    stored_offsets,
    toml_config,
    unique,
    watermarks,
)
from tests.integration._reliability import finish, start_cli

UPSERT = {"mode": "upsert", "key": ["order_id"]}
AGGREGATE = {"mode": "aggregate", "group_by": ["customer"],
             "aggregates": {"orders": "count(*)", "total": "sum(amount)",
                            "smallest": "min(amount)", "biggest": "max(amount)",
                            "priced": "count(amount)"}}


# ---- records -----------------------------------------------------------------------------

def event(order_id: int, version: int, customer: str | None = None) -> tuple[bytes, bytes]:
    """An order's change event, keyed by its id (so Kafka keeps each order in one partition)."""
    amount = None if version % 5 == 4 else f"{order_id % 97}.{version:02d}"
    return (str(order_id).encode(), json.dumps({
        "order_id": order_id, "customer": customer or f"c{order_id % 7}",
        "amount": amount, "status": f"v{version}"}).encode())


def tombstone(order_id: int) -> tuple[bytes, None]:
    return (str(order_id).encode(), None)


def kafka_log(topic: str, until: dict[int, int]) -> list:
    """Every record of ``topic`` below ``until`` (per partition), in offset order per
    partition: (partition, offset, key, value, Kafka timestamp in ms)."""
    consumer = Consumer({"bootstrap.servers": BOOTSTRAP, "group.id": unique("check"),
                         "enable.auto.commit": False})
    out = []
    try:
        for partition, end in until.items():
            if end == 0:
                continue
            consumer.assign([TopicPartition(topic, partition, 0)])
            while True:
                m = consumer.poll(10)
                assert m is not None, f"{topic}[{partition}] ended early"
                if m.error():
                    continue
                out.append((partition, m.offset(), m.key(), m.value(), m.timestamp()[1]))
                if m.offset() >= end - 1:
                    break
    finally:
        consumer.close()
    return out


def committed(settings, topic: str) -> dict[int, int]:
    return {p: o for (t, p), o in stored_offsets(settings.name).items() if t == topic}


# ---- the state a sink must hold, recomputed ----------------------------------------------

# Epoch ms of 10000-01-01: a Kafka timestamp from then on orders as none.
LAST_TIME_MS = 253_402_300_800_000


def newest_per_key(records) -> dict:
    """The upsert rule, recomputed apart from pipeline/sinks/upsert.py (docs/reliability.md,
    "Upsert across partitions"): of one key's records, within a partition the higher offset
    is newer; across partitions the later order time (the latest Kafka timestamp of the
    key's records in that partition, up to the record; one from year 10000 on counts as
    none), then the higher partition.
    ``records``: (key, partition, offset, timestamp, ...) of one topic -> key -> record."""
    per_partition: dict[tuple, tuple] = {}
    latest: dict[tuple, int] = {}  # the partition's newest record's order time
    for r in records:
        k, partition, offset, ts = r[:4]
        if (k, partition) not in per_partition or offset > per_partition[(k, partition)][2]:
            per_partition[(k, partition)] = r
        if ts is not None and ts < LAST_TIME_MS:
            latest[(k, partition)] = max(ts, latest.get((k, partition), ts))
    newest: dict = {}
    for (k, partition), r in per_partition.items():
        order = (latest.get((k, partition), float("-inf")), partition)
        if k not in newest or order > newest[k][0]:
            newest[k] = (order, r)
    return {k: r for k, (_, r) in newest.items()}


def expected_state(settings, topic: str, *, label: bool = False,
                   tombstones_delete: bool = True) -> dict[int, tuple]:
    """The newest record per order_id among the committed records, by the upsert rule:
    order_id -> (status, amount, partition, offset), + the status upper-cased when
    ``label`` (the label_status transform). A tombstone deletes its key; under a transform
    (``tombstones_delete`` False) it is a dead letter, not a record of its key."""
    log = [(int(key), partition, offset, ts, value)
           for partition, offset, key, value, ts in kafka_log(topic, committed(settings, topic))
           if tombstones_delete or value is not None]
    state: dict[int, tuple] = {}
    for order_id, (_, partition, offset, _, value) in newest_per_key(log).items():
        if value is None:
            continue
        doc = json.loads(value)
        amount = None if doc["amount"] is None else Decimal(doc["amount"])
        state[order_id] = ((doc["status"], amount, partition, offset)
                           + ((doc["status"].upper(),) if label else ()))
    return state


def expected_totals(settings, topic: str,
                    counted: Callable[[dict], bool] = lambda doc: True) -> dict[str, tuple]:
    """Recomputed from every committed Kafka record that ``counted`` keeps (a filtering
    transform's rule): customer -> (orders, total, smallest, biggest, priced)."""
    groups: dict[str, list] = defaultdict(list)
    for _, _, _, value, _ in kafka_log(topic, committed(settings, topic)):
        doc = json.loads(value)
        if counted(doc):
            groups[doc["customer"]].append(None if doc["amount"] is None
                                           else Decimal(doc["amount"]))
    out = {}
    for customer, amounts in groups.items():
        priced = [a for a in amounts if a is not None]
        out[customer] = (len(amounts), sum(priced) if priced else None,
                         min(priced, default=None), max(priced, default=None), len(priced))
    return out


# ---- the tables as they are --------------------------------------------------------------

def table_state(table: str, *, label: bool = False) -> dict[int, tuple]:
    return {r[0]: tuple(r[1:]) for r in query(
        f'SELECT order_id, status, amount, "partition", "offset"{", label" if label else ""} '
        f"FROM {table}")}


def table_totals(table: str) -> dict[str, tuple]:
    return {r[0]: tuple(r[1:]) for r in query(
        f"SELECT customer, orders, total, smallest, biggest, priced FROM {table}")}


def assert_same(want: dict, got: dict) -> dict:
    """The table equals the recomputation; names the first differences. Returns ``want``."""
    wrong = {k: (want.get(k), got.get(k)) for k in set(want) | set(got)
             if want.get(k) != got.get(k)}
    assert not wrong, \
        f"{len(wrong)} of {len(want)} differ (expected, actual): {list(wrong.items())[:5]}"
    return want


def assert_upsert_exact(settings, topic: str) -> dict:
    return assert_same(expected_state(settings, topic), table_state(settings.sink.table))


# ---- pipelines ---------------------------------------------------------------------------

def upsert_settings(name: str, topic: str, **sink):
    columns = {"order_id": "long", "customer": "string not null", "amount": "decimal(12,2)",
               "status": "string"}
    return init_db(make_settings(name, [topic], sink={**UPSERT, "columns": columns, **sink}))


def aggregate_settings(name: str, topic: str):
    return init_db(make_settings(name, [topic], sink=AGGREGATE))


def aggregates_toml() -> str:
    """AGGREGATE's [sink.aggregates] table as the TOML of a config file."""
    return "[sink.aggregates]\n" + "".join(
        f'{k} = "{v}"\n' for k, v in AGGREGATE["aggregates"].items())


def aggregate_config(tmp_path, name: str, topic: str, sink: str = "") -> str:
    """A CLI config of an aggregate pipeline with AGGREGATE's totals (``sink``: more
    [sink] lines), its tables made by init-db."""
    sink = 'mode = "aggregate"\ngroup_by = ["customer"]\n' + sink + aggregates_toml()
    config = tmp_path / f"{name}.toml"
    config.write_text(toml_config(name, [topic], extra_sink=sink))
    init_cli(config)
    return str(config)


def upsert_config(tmp_path, name: str, topic: str, sink: str = "",
                  columns: str = 'status = "string"') -> str:
    """A CLI config of an upsert pipeline keyed by order_id (``columns`` declared beside
    it; ``sink``: more [sink] lines), its tables made by init-db."""
    config = tmp_path / f"{name}.toml"
    config.write_text(toml_config(name, [topic], extra_sink=(
        'mode = "upsert"\nkey = ["order_id"]\n' + sink)).replace(
        'order_id = "long not null"', f'order_id = "long"\n{columns}'))
    init_cli(config)
    return str(config)


# ---- kills -------------------------------------------------------------------------------

def killed_then_rerun(settings, topic: str, config: str, point: str, case: int,
                      deletes: bool, assert_exact: Callable[[], object]) -> None:
    """One kill case: new events (updates of the previous case's keys, new keys, and
    tombstones when ``deletes``), a CLI run SIGKILLed (its whole process tree) at fault
    ``point``, then an in-process rerun. Right after the kill the offsets are unchanged
    (moved, for after_commit) and ``assert_exact`` holds; after the rerun the offsets are at
    the ends and it holds again (it returns the expected state: not empty)."""
    records = [event(k, case) for k in range(case * 50, case * 50 + 300)]
    if deletes:
        records += [tombstone(k) for k in range(case * 50, case * 50 + 300, 7)]
    produce(topic, records)
    before = committed(settings, topic)
    ends = {p: hi for p, (_, hi) in watermarks(topic).items()}
    code, _, err = finish(start_cli("run", "--config", config,
                                    env={"PIPELINE_FAULT": f"{point}:kill"}))
    assert code == -signal.SIGKILL, (point, err[-2000:])
    assert committed(settings, topic) == (ends if point == "after_commit" else before)
    assert_exact()
    assert run_ingest(settings).status == ("noop" if point == "after_commit" else "succeeded")
    assert committed(settings, topic) == ends
    assert assert_exact(), "the table holds something"
