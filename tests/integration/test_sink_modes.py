"""The upsert and aggregate sinks against the real stack: the table always equals what a
recomputation from Kafka says it must (the newest record per key, or the totals of every
committed record), after several runs, replays, tombstones and SIGKILLs at every fault
point."""

from __future__ import annotations

import csv
import json
import signal
from collections import defaultdict
from decimal import Decimal

import pytest
from confluent_kafka import Consumer, TopicPartition

from pipeline import faults
from pipeline.config import load_settings
from pipeline.driver.backfill import run_backfill
from pipeline.driver.job import run_ingest
from pipeline.errors import ConfigError, DataError
from pipeline.plan.offsets import OffsetRange
from tests.helpers import (
    BOOTSTRAP,
    ROOT,
    TEST_DB_URL,
    create_topic,
    init_cli,
    init_db,
    job_db_url,
    make_settings,
    produce,
    query,
    run_cli,
    stored_offsets,
    toml_config,
    unique,
    watermarks,
)
from tests.integration._reliability import finish, one_error_line, start_cli, start_paused

UPSERT = {"mode": "upsert", "key": ["order_id"]}
AGGREGATE = {"mode": "aggregate", "group_by": ["customer"],
             "aggregates": {"orders": "count(*)", "total": "sum(amount)",
                            "smallest": "min(amount)", "biggest": "max(amount)",
                            "priced": "count(amount)"}}


def event(order_id: int, version: int, customer: str | None = None) -> tuple[bytes, bytes]:
    """An order's change event, keyed by its id (so Kafka keeps each order in one partition)."""
    amount = None if version % 5 == 4 else f"{order_id % 97}.{version:02d}"
    return (str(order_id).encode(), json.dumps({
        "order_id": order_id, "customer": customer or f"c{order_id % 7}",
        "amount": amount, "status": f"v{version}"}).encode())


def tombstone(order_id: int) -> tuple[bytes, None]:
    return (str(order_id).encode(), None)


def upsert_settings(name: str, topic: str, **sink):
    columns = {"order_id": "long", "customer": "string not null", "amount": "decimal(12,2)",
               "status": "string"}
    return init_db(make_settings(name, [topic], sink={**UPSERT, "columns": columns, **sink}))


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


def newest_per_key(records) -> dict:
    """The upsert rule, recomputed apart from pipeline/sinks/upsert.py (docs/reliability.md,
    "Upsert across partitions"): of one key's records, within a partition the higher offset
    is newer; across partitions the later Kafka timestamp, then the higher partition.
    ``records``: (key, partition, offset, timestamp, ...) of one topic -> key -> record."""
    per_partition: dict[tuple, tuple] = {}
    for r in records:
        k, partition, offset = r[:3]
        if (k, partition) not in per_partition or offset > per_partition[(k, partition)][2]:
            per_partition[(k, partition)] = r
    newest: dict = {}
    for (k, _), r in per_partition.items():
        if k not in newest or (r[3], r[1]) > (newest[k][3], newest[k][1]):
            newest[k] = r
    return newest


def expected_state(settings, topic: str) -> dict[int, tuple]:
    """The newest record per order_id among the committed records, by the upsert rule (a
    tombstone deletes): order_id -> (status, amount, partition, offset)."""
    state: dict[int, tuple] = {}
    log = [(int(key), partition, offset, ts, value)
           for partition, offset, key, value, ts in kafka_log(topic, committed(settings, topic))]
    for order_id, (_, partition, offset, _, value) in newest_per_key(log).items():
        if value is None:
            continue
        doc = json.loads(value)
        amount = None if doc["amount"] is None else Decimal(doc["amount"])
        state[order_id] = (doc["status"], amount, partition, offset)
    return state


def table_state(table: str) -> dict[int, tuple]:
    return {r[0]: tuple(r[1:]) for r in query(
        f'SELECT order_id, status, amount, "partition", "offset" FROM {table}')}


def assert_upsert_exact(settings, topic: str) -> None:
    want, got = expected_state(settings, topic), table_state(settings.sink.table)
    wrong = {k: (want.get(k), got.get(k)) for k in set(want) | set(got)
             if want.get(k) != got.get(k)}
    assert not wrong, f"{len(wrong)} keys differ (expected, actual): {list(wrong.items())[:5]}"


# ---- upsert ------------------------------------------------------------------------------

@pytest.mark.spark_line
def test_upsert_keeps_the_newest_record_per_key_across_runs(spark):
    name = unique("ups")
    topic = create_topic(name, 3)
    settings = upsert_settings(name, topic)
    keys = range(1000)
    for version in range(4):  # four runs, each updating every key once more
        produce(topic, [event(k, version) for k in keys])
        if version == 2:  # every 10th order deleted; every 20th comes back in the next run
            produce(topic, [tombstone(k) for k in keys if k % 10 == 0])
        result = run_ingest(settings)
        assert result.status == "succeeded"
        if version == 3:
            produce(topic, [tombstone(k) for k in keys if k % 10 == 5])
            result = run_ingest(settings)
            assert result.rows_deleted == 100 and result.rows_written == 0, result
    assert_upsert_exact(settings, topic)
    state = table_state(settings.sink.table)
    assert len(state) == 900 and all(v[0] == "v3" for v in state.values())
    # The tombstones are remembered, by the record that deleted.
    assert query(f"SELECT count(*) FROM {name}_deleted") == [(100,)]


def test_upsert_replay_of_old_ranges_changes_nothing(spark):
    name = unique("upsr")
    topic = create_topic(name, 2)
    settings = upsert_settings(name, topic)
    produce(topic, [event(k, 0) for k in range(200)])
    run_ingest(settings)
    first = committed(settings, topic)
    produce(topic, [event(k, 1) for k in range(200)] + [tombstone(k) for k in range(0, 200, 3)])
    run_ingest(settings)
    second = committed(settings, topic)
    produce(topic, [event(k, 2) for k in range(0, 200, 6)])  # half the deleted keys return
    run_ingest(settings)
    ends = committed(settings, topic)

    def snapshot() -> tuple:
        return (query(f"SELECT *, xmin::text FROM {name} ORDER BY order_id"),
                query(f"SELECT *, xmin::text FROM {name}_deleted ORDER BY order_id"))

    before = snapshot()
    assert len(before[1]) == 67 - 34  # the keys still deleted
    # Ranges ending after the first run (older versions of every key, the deleted ones
    # included), after the second (tombstones older than the rows that came back), and
    # everything.
    for until in (first, second, ends):
        ranges = [OffsetRange(topic, p, 0, end) for p, end in until.items()]
        result = run_backfill(settings, ranges)
        assert result.records_read == sum(until.values())
        assert result.rows_written == 0 and result.rows_deleted == 0, result
        # Not one row or tombstone written (xmin would change), no deleted key brought
        # back, no stale tombstone added.
        assert snapshot() == before
    assert_upsert_exact(settings, topic)
    # A reprocess derives the rows of its ranges again, and still keeps the newest.
    run_backfill(settings, ranges, reprocess=True)
    assert_upsert_exact(settings, topic)


def test_a_backfill_beside_an_ingest_that_deletes_does_not_bring_the_key_back(spark, tmp_path):
    """The ingest deletes key 1 and holds its publishing transaction open; a backfill of
    key 1's older record publishes meanwhile. The merges take turns, so the backfill sees
    the committed tombstone; before, its snapshot predated it and re-inserted the row."""
    name = unique("upsc")
    topic = create_topic(name, 1)
    config = tmp_path / f"{name}.toml"
    config.write_text(toml_config(name, [topic], extra_sink=(
        'mode = "upsert"\nkey = ["order_id"]')).replace(
        'order_id = "long not null"', 'order_id = "long"\nstatus = "string"'))
    init_cli(config)
    settings = load_settings(config, environ={})
    produce(topic, [event(1, 0), event(2, 0)])
    run_ingest(settings)
    produce(topic, [tombstone(1)])
    ingest = start_paused("run", "--config", str(config), point="before_commit", seconds=8)
    result = run_backfill(settings, [OffsetRange(topic, 0, 0, 2)])
    code, _, err = finish(ingest)
    assert code == 0, err[-2000:]
    assert result.rows_written == 0, result
    assert sorted(table_state(name)) == [2]
    assert_upsert_exact(settings, topic)


def test_upsert_key_in_two_partitions_of_one_run_keeps_the_later_record(spark):
    """Before: exit 3 "key in both [0] and [1]", in every rerun. Now the rule across
    partitions decides (tests/integration/test_partition_growth.py has its cases)."""
    name = unique("upsp")
    topic = create_topic(name, 2)
    settings = upsert_settings(name, topic)
    produce(topic, [event(1, 0)], partition=0)
    produce(topic, [event(1, 1)], partition=1)  # produced later: a later or equal timestamp
    result = run_ingest(settings)
    assert (result.status, result.rows_written) == ("succeeded", 1), result
    assert table_state(name)[1][0::2] == ("v1", 1)
    assert_upsert_exact(settings, topic)
    assert stored_offsets(name) == {(topic, 0): 1, (topic, 1): 1}


def test_upsert_tombstone_without_a_usable_key_is_a_dead_letter(spark):
    name = unique("upst")
    topic = create_topic(name, 1)
    settings = upsert_settings(name, topic)
    produce(topic, [event(7, 0), (None, None), (b'{"customer": "x"}', None), tombstone(7)])
    result = run_ingest(settings)
    assert (result.rows_written, result.rows_deleted, result.dead_letters) == (0, 0, 2)
    assert query(f"SELECT count(*) FROM {name}") == [(0,)]
    dead = query("SELECT \"offset\", error_type, error_message FROM pipeline_dead_letters "
                 "WHERE pipeline = %s ORDER BY 1", (name,))
    assert [(o, t) for o, t, _ in dead] == [(1, "bad_tombstone"), (2, "bad_tombstone")]
    assert "no Kafka key" in dead[0][2] and "without 'order_id'" in dead[1][2]


def test_upsert_tombstones_as_dead_letters_when_configured(spark):
    name = unique("upsd")
    topic = create_topic(name, 1)
    settings = upsert_settings(name, topic, tombstones="dead_letter")
    produce(topic, [event(7, 0), tombstone(7)])
    result = run_ingest(settings)
    assert (result.rows_written, result.dead_letters) == (1, 1)
    assert table_state(name)[7][0] == "v0"


def test_switching_an_append_table_to_upsert_is_refused_before_reading(spark):
    name = unique("upsk")
    topic = create_topic(name, 1)
    init_db(make_settings(name, [topic]))  # an append table of the same name
    settings = init_db(make_settings(name, [topic], sink=UPSERT))  # adds upk_deleted
    produce(topic, [event(1, 0)])
    with pytest.raises(ConfigError, match=r"keyed by \(topic, partition, offset\).*needs the "
                                          r"key \(order_id\)"):
        run_ingest(settings)
    assert stored_offsets(name) == {}


# ---- aggregate ---------------------------------------------------------------------------

def aggregate_settings(name: str, topic: str):
    return init_db(make_settings(name, [topic], sink=AGGREGATE))


def expected_totals(settings, topic: str) -> dict[str, tuple]:
    """Recomputed from every committed Kafka record: customer -> (orders, total, smallest,
    biggest, priced)."""
    groups: dict[str, list] = defaultdict(list)
    for _, _, _, value, _ in kafka_log(topic, committed(settings, topic)):
        doc = json.loads(value)
        groups[doc["customer"]].append(None if doc["amount"] is None
                                       else Decimal(doc["amount"]))
    out = {}
    for customer, amounts in groups.items():
        priced = [a for a in amounts if a is not None]
        out[customer] = (len(amounts), sum(priced) if priced else None,
                         min(priced, default=None), max(priced, default=None), len(priced))
    return out


def table_totals(table: str) -> dict[str, tuple]:
    return {r[0]: tuple(r[1:]) for r in query(
        f"SELECT customer, orders, total, smallest, biggest, priced FROM {table}")}


def test_aggregate_totals_equal_a_recomputation_after_several_runs(spark):
    name = unique("agg")
    topic = create_topic(name, 3)
    settings = aggregate_settings(name, topic)
    for batch in range(3):
        produce(topic, [event(k, batch) for k in range(batch * 500, batch * 500 + 700)])
        assert run_ingest(settings).status == "succeeded"
    assert run_ingest(settings).status == "noop"
    want = expected_totals(settings, topic)
    assert sum(v[0] for v in want.values()) == 2100
    assert table_totals(name) == want


def aggregate_config(tmp_path, name: str, topic: str) -> str:
    sink = ('mode = "aggregate"\ngroup_by = ["customer"]\n[sink.aggregates]\n'
            + "".join(f'{k} = "{v}"\n' for k, v in AGGREGATE["aggregates"].items()))
    config = tmp_path / f"{name}.toml"
    config.write_text(toml_config(name, [topic], extra_sink=sink))
    init_cli(config)
    return str(config)


def test_aggregate_pipeline_refuses_backfill_reprocess_and_rewind(spark, tmp_path):
    name = unique("aggr")
    topic = create_topic(name, 1)
    config = aggregate_config(tmp_path, name, topic)
    produce(topic, [event(k, 0) for k in range(10)])
    r = run_cli("run", "--config", config)
    assert r.returncode == 0, r.stderr[-2000:]
    before = query(f"SELECT * FROM {name} ORDER BY customer")
    backfill = ["backfill", "--topic", topic, "--from-offset", "0", "--to-offset", "10"]
    for args in (backfill, [*backfill, "--reprocess"],
                 ["offsets", "set", "--topic", topic, "--to", "earliest", "--yes"]):
        r = run_cli(*args, "--config", config)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        line = one_error_line(r.stderr)
        assert "count them again" in line and "TRUNCATE" in line, line
    assert query(f"SELECT * FROM {name} ORDER BY customer") == before
    assert stored_offsets(name) == {(topic, 0): 10}


def test_the_example_configs_run_as_documented(spark, tmp_path):
    """conf/examples/*.toml, pointed at a fresh topic, table and pipeline name."""
    from dataclasses import replace

    from pipeline.config import with_overrides

    def example(path: str, topic: str):
        s = load_settings(path, environ={})
        name = unique(s.name[:10])
        s = replace(with_overrides(s, topics=(topic,), bootstrap_servers=BOOTSTRAP), name=name,
                    database_url=TEST_DB_URL,
                    sink=replace(s.sink, table=name))
        return init_db(s)

    topic = create_topic(unique("ex"), 2)
    produce(topic, [(b"1", b'{"order_id": 1, "customer": "a", "status": "placed"}'),
                    (b"2", b'{"order_id": 2, "customer": "b", "status": "placed"}'),
                    (b"1", b'{"order_id": 1, "customer": "a", "status": "shipped"}'),
                    (b"2", None)])
    upsert = example("conf/examples/upsert.toml", topic)
    result = run_ingest(upsert)
    assert (result.rows_written, result.rows_deleted) == (1, 0)  # 2 was deleted in-run
    assert query(f"SELECT order_id, status FROM {upsert.sink.table}") == [(1, "shipped")]
    assert query(f"SELECT order_id FROM {upsert.sink.table}_deleted") == [(2,)]

    topic = create_topic(unique("ex"), 2)
    produce(topic, [(b"a", json.dumps({"customer": "a", "day": d, "amount": amount,
                                       "placed_at": f"{d}T10:00:00Z"}).encode())
                    for d, amount in [("2026-01-01", "1.50"), ("2026-01-01", None),
                                      ("2026-01-02", "2.25"), ("2026-01-01", "3.00")]])
    totals = example("conf/examples/aggregate.toml", topic)
    run_ingest(totals)
    assert query(f"SELECT customer, day::text, orders, total_amount, priced_orders, biggest "
                 f"FROM {totals.sink.table} ORDER BY day") == [
        ("a", "2026-01-01", 3, Decimal("4.50"), 2, Decimal("3.00")),
        ("a", "2026-01-02", 1, Decimal("2.25"), 1, Decimal("2.25"))]

    run_transform_example(tmp_path)


def run_transform_example(tmp_path) -> None:
    """conf/examples/transform.toml as its comment says to run it: the sample producer's
    orders, the CLI with its transform's folder on PYTHONPATH (relative, from the checkout),
    against a copy pointed at a fresh topic, table and pipeline name. The table must hold
    the transform recomputed here: good orders with an amount > 0, joined with
    customers.csv, banded."""
    from pipeline import sample

    name = unique("exte")
    topic = create_topic(name, 2)
    sample.produce(BOOTSTRAP, topic, 300, bad_every=50, partitions=2)  # 6 bad
    text = (ROOT / "conf/examples/transform.toml").read_text()
    for old, new in [('name = "enriched_orders"', f'name = "{name}"'),
                     ('table = "enriched_orders"', f'table = "{name}"'),
                     ('topics = ["orders"]', f'topics = ["{topic}"]'),
                     ('"127.0.0.1:9092"', f'"{BOOTSTRAP}"'),
                     ('"postgresql://postgres@127.0.0.1:5433/pipeline"', f'"{job_db_url()}"')]:
        assert old in text, old
        text = text.replace(old, new)
    config = tmp_path / "transform.toml"
    config.write_text(text)
    init_cli(config)
    r = run_cli("run", "--config", str(config), "--json",
                env={"PYTHONPATH": "conf/examples/transforms"})
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert sum(r["until"] - r["from"] for r in summary["plan"]) == 300, summary
    # Every record read is counted, the one the transform filtered out too.
    assert (summary["records_read"], summary["rows_written"], summary["dead_letters"]) == \
        (300, 293, 6), summary
    [(per_partition,)] = query("SELECT per_partition FROM pipeline_runs WHERE pipeline = %s "
                               "AND status = 'succeeded'", (name,))
    assert sum(v.get("filtered", 0) for v in per_partition.values()) == 1, per_partition

    with (ROOT / "conf/examples/transforms/customers.csv").open() as f:
        dimension = {row["customer"]: (row["region"], row["segment"])
                     for row in csv.DictReader(f)}
    want = {}
    for i in range(300):
        if i % 50 == 49:  # the sample's bad records
            continue
        doc = json.loads(sample.order(i))
        amount = Decimal(str(doc["amount"]))
        if amount > 0:
            band = "small" if amount < 1000 else "medium" if amount < 10000 else "large"
            want[i] = (*dimension.get(doc["customer"], ("unknown", None)), band, amount)
    got = {r[0]: tuple(r[1:]) for r in query(
        f"SELECT order_id, region, segment, amount_band, amount FROM {name}")}
    assert got == want and len(got) == 293
    assert {v[0] for v in got.values()} == {"north", "south", "east", "west", "unknown"}


@pytest.mark.parametrize("mode", ["upsert", "aggregate"])
def test_offsets_reset_of_a_recreated_topic_per_mode(spark, tmp_path, monkeypatch, mode):
    """The named fix of a recreated topic: upsert archives the old topic's rows and drops
    its tombstones (their offsets would hide the new topic's records); aggregate keeps the
    totals, which counted the old topic's records once, and adds the new topic's."""
    from pipeline.cli import main as cli_main
    from tests.integration.test_bad_input import recreate_topic

    monkeypatch.setenv("PIPELINE__KAFKA__BOOTSTRAP_SERVERS", BOOTSTRAP)
    for old in ("KAFKA_BOOTSTRAP_SERVERS", "PIPELINE_DATABASE_URL", "PIPELINE__DATABASE__URL"):
        monkeypatch.delenv(old, raising=False)
    name = unique(f"re{mode[:3]}")
    topic = create_topic(name, 1)
    config = tmp_path / "c.toml"
    if mode == "upsert":
        config.write_text(toml_config(name, [topic], extra_sink=(
            'mode = "upsert"\nkey = ["order_id"]')).replace(
            'order_id = "long not null"', 'order_id = "long"\nstatus = "string"'))
        init_cli(config)
    else:
        config = aggregate_config(tmp_path, name, topic)
    settings = load_settings(config, environ={})
    old = [event(k, 0) for k in range(10)] + ([tombstone(9)] if mode == "upsert" else [])
    produce(topic, old)
    run_ingest(settings)
    recreate_topic(topic, 1)
    new = [event(k, 1) for k in range(10)]  # key 9 at offset 9, below its tombstone's 10
    produce(topic, new)
    with pytest.raises(DataError, match="deleted and recreated"):
        run_ingest(settings)
    assert cli_main(["offsets", "reset", "--topic", topic, "--to", "earliest",
                     "--config", str(config), "--yes"]) == 0
    run_ingest(settings)
    if mode == "upsert":
        assert table_state(name) == {k: ("v1", Decimal(f"{k}.01"), 0, k) for k in range(10)}
        assert query(f"SELECT count(*) FROM {name}_archived") == [(9,)]
        assert query(f"SELECT count(*) FROM {name}_deleted") == [(0,)]
    else:
        want: dict[str, list] = defaultdict(list)
        for _, value in old + new:
            doc = json.loads(value)
            want[doc["customer"]].append(Decimal(doc["amount"]))
        assert {c: (v[0], v[1]) for c, v in table_totals(name).items()} == {
            c: (len(a), sum(a)) for c, a in want.items()}


# ---- crashes -----------------------------------------------------------------------------

@pytest.mark.parametrize("mode", ["upsert", "aggregate"])
def test_sigkill_at_every_fault_point_then_rerun_is_exact(spark, tmp_path, mode):
    """For each fault point in turn: new events (updates, tombstones), a CLI run killed
    there (SIGKILL of its whole process tree), a rerun. Before and after the rerun, the
    table must equal the recomputation from the committed Kafka records: nothing applied
    half, nothing applied twice."""
    name = unique(mode[:3] + "k")
    topic = create_topic(name, 2)
    if mode == "upsert":
        config = tmp_path / f"{name}.toml"
        config.write_text(toml_config(name, [topic], extra_sink=(
            'mode = "upsert"\nkey = ["order_id"]')).replace(
            'order_id = "long not null"', 'order_id = "long"\nstatus = "string"'))
        init_cli(config)
        config = str(config)
    else:
        config = aggregate_config(tmp_path, name, topic)
    settings = load_settings(config, environ={})

    def assert_exact() -> None:
        if mode == "upsert":
            assert_upsert_exact(settings, topic)
        else:
            assert table_totals(name) == expected_totals(settings, topic)

    for n, point in enumerate(faults.POINTS):
        records = [event(k, n) for k in range(n * 50, n * 50 + 300)]
        if mode == "upsert":
            records += [tombstone(k) for k in range(n * 50, n * 50 + 300, 7)]
        produce(topic, records)
        before = committed(settings, topic)
        ends = {p: hi for p, (_, hi) in watermarks(topic).items()}
        code, _, err = finish(start_cli("run", "--config", config,
                                        env={"PIPELINE_FAULT": f"{point}:kill"}))
        assert code == -signal.SIGKILL, (point, err[-2000:])
        assert committed(settings, topic) == (ends if point == "after_commit" else before)
        assert_exact()
        assert run_ingest(settings).status == ("noop" if point == "after_commit"
                                               else "succeeded")
        assert committed(settings, topic) == ends
        assert_exact()
