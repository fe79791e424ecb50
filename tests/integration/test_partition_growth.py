"""An upsert pipeline whose topic grows (issue 23, items 4 and 5): a key's records end up in
two partitions, and which one is newer must be decided the same way within a run, across
runs, and by a backfill or reprocess, without stopping the pipeline; a re-read of the old
partition must never overwrite newer state or bring a deleted key back.

The rule (docs/reliability.md, "Upsert across partitions"): within a partition the higher
offset is newer; across partitions the later Kafka record timestamp, then the higher
partition. Every record here is produced to an explicit partition with an explicit
timestamp, so which record is newer is known before the run. The topic grows through
Kafka's Admin API, as an operator grows a real topic."""

from __future__ import annotations

import time

from confluent_kafka import Producer
from confluent_kafka.admin import NewPartitions

from pipeline.config import load_settings
from pipeline.driver.backfill import run_backfill
from pipeline.driver.job import run_ingest
from pipeline.plan.offsets import OffsetRange
from pipeline.sinks import upsert
from tests.helpers import (
    BOOTSTRAP,
    admin,
    cli_here,
    create_topic,
    init_cli,
    query,
    stored_offsets,
    toml_config,
    unique,
    watermarks,
)
from tests.integration._sink_modes import (
    assert_upsert_exact,
    event,
    table_state,
    tombstone,
)

# Ten minutes ago, whole seconds: timestamps in the past that no broker limit refuses.
BASE = (int(time.time()) - 600) * 1000


def produce_at(topic: str, partition: int, records: list[tuple[bytes, bytes | None, int]]
               ) -> None:
    """(key, value, timestamp in ms) records into one partition, in this order."""
    p = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True})
    for key, value, ts in records:
        p.produce(topic, key=key, value=value, partition=partition, timestamp=ts)
    assert p.flush(30) == 0


def at(record: tuple[bytes, bytes | None], ts: int) -> tuple[bytes, bytes | None, int]:
    return (*record, ts)


def grow(topic: str, partitions: int) -> None:
    """Add partitions to a live topic, and wait until its metadata shows them."""
    client = admin()  # kept until the future resolves (a dropped handle cancels it)
    client.create_partitions([NewPartitions(topic, partitions)])[topic].result()
    for _ in range(100):
        if len(watermarks(topic)) == partitions:
            return
        time.sleep(0.1)
    raise AssertionError(f"{topic} did not grow to {partitions} partitions")


def pipeline(tmp_path, name: str, topic: str):
    """An upsert pipeline keyed by order_id, set up through the CLI: (config path, settings)."""
    config = tmp_path / f"{name}.toml"
    config.write_text(toml_config(name, [topic], extra_sink=(
        'mode = "upsert"\nkey = ["order_id"]')).replace(
        'order_id = "long not null"', 'order_id = "long"\nstatus = "string"'))
    init_cli(config)
    return str(config), load_settings(config, environ={})


def cli(*args: str) -> str:
    r = cli_here(*args)
    assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stderr[-3000:]}"
    return r.stderr


def status(name: str, order_id: int = 1) -> tuple | None:
    """(status, partition, offset) of the key's row, or None."""
    row = table_state(name).get(order_id)
    return None if row is None else (row[0], row[2], row[3])


def snapshot(name: str) -> tuple:
    """Every row and tombstone with its xmin: any write changes it."""
    return (query(f"SELECT *, xmin::text FROM {name} ORDER BY order_id"),
            query(f"SELECT *, xmin::text FROM {name}_deleted ORDER BY order_id"))


# (name, topic, partition, offset, Kafka timestamp in ms or None, order time in ms or None:
# the stored one; None for an older table's row, whose own timestamp counts)
RECORDS = [("a", "t", 0, 5, 100, None), ("b", "t", 0, 6, 50, 100), ("c", "t", 1, 0, 100, None),
           ("d", "t", 1, 1, None, 100), ("e", "u", 0, 0, 100, None), ("f", "t", 2, 0, 99, None),
           ("g", "t", 3, 0, 253_402_300_800_000, None), ("h", "t", 4, 0, 98, 98)]


def test_the_rule_orders_any_two_records_of_a_key_in_postgres():
    """upsert.newer evaluated by Postgres on every pair: within a partition the offset (b
    after a, though stamped earlier; d after c, though it has no timestamp), across
    partitions the order time (a after f; b carries a's, so b after f too), equal order
    times the higher partition (c after a and b, d after a), then the topic (e after a); a
    timestamp in year 10000 orders as none (a after g). Of any two records exactly one is
    newer, and the order is total: transitive over every triple."""
    def ts(ms):
        return "NULL" if ms is None else f"to_timestamp({ms} / 1000.0)"

    values = ", ".join(
        f"('{n}', '{t}', {p}, {o}::bigint, {ts(k)}::timestamptz, {ts(ot)}::timestamptz)"
        for n, t, p, o, k, ot in RECORDS)
    cols = '(name, topic, "partition", "offset", kafka_timestamp, _order_time)'
    pairs = {(x, y): is_newer for x, y, is_newer in query(
        f"SELECT l.name, r.name, {upsert.newer('l', 'r').as_string(None)} "
        f"FROM (VALUES {values}) AS l{cols}, (VALUES {values}) AS r{cols} "
        "WHERE l.name <> r.name")}
    newer = {x + y for (x, y), is_newer in pairs.items() if is_newer}
    assert newer >= {"ba", "dc", "af", "bf", "ca", "cb", "ea", "da", "ag", "fh"}, newer
    assert not newer & {"ab", "cd", "fa", "fb", "ac", "bc", "ae", "ad", "ga", "hf"}, newer
    assert None not in pairs.values(), pairs
    assert all(pairs[(x, y)] != pairs[(y, x)] for x, y in pairs), pairs
    names = [r[0] for r in RECORDS]
    assert all(not (pairs[(x, y)] and pairs[(y, z)]) or pairs[(x, z)]
               for x in names for y in names for z in names if len({x, y, z}) == 3)


def test_a_key_in_both_partitions_of_one_run_keeps_the_newer_by_the_rule(spark, tmp_path):
    """Before: exit 3 "upsert key (order_id=1) is in both T[0] and T[1] in this run", and the
    same in every rerun. Key 1: partition 1's record is older by timestamp although it
    has the higher partition (a straggler in 0 came later). Key 2: equal timestamps, so
    the higher partition. Key 3: within partition 0 the offset decides, although the later
    record carries the earlier timestamp."""
    name = unique("grow")
    topic = create_topic(name, 1)
    config, settings = pipeline(tmp_path, name, topic)
    grow(topic, 2)
    produce_at(topic, 1, [at(event(1, 1), BASE + 1000), at(event(2, 1), BASE + 5000)])
    produce_at(topic, 0, [at(event(1, 2), BASE + 2000), at(event(2, 2), BASE + 5000),
                          at(event(3, 1), BASE + 9000), at(event(3, 2), BASE + 3000)])
    err = cli("run", "--config", config)
    assert "2 records superseded by their key's record in another partition of this run" \
        in err, err[-3000:]
    assert status(name, 1) == ("v2", 0, 0)
    assert status(name, 2) == ("v1", 1, 1)
    assert status(name, 3) == ("v2", 0, 3)
    assert_upsert_exact(settings, topic)
    assert stored_offsets(name) == {(topic, 0): 4, (topic, 1): 2}


def test_records_split_into_runs_differently_end_in_the_same_row(spark, tmp_path):
    """The rule within a run and across runs is one: pipeline A reads both records in one
    run, pipeline B reads partition 0's (later) record first, then partition 1's (earlier)
    one. Before: A stopped with exit 3, and B's second run took partition 1's older record
    because an ingest took any record of another partition as newer."""
    name = unique("grow")
    topic = create_topic(name, 2)
    config_a, _ = pipeline(tmp_path, f"{name}_a", topic)
    config_b, settings_b = pipeline(tmp_path, f"{name}_b", topic)
    produce_at(topic, 0, [at(event(1, 2), BASE + 2000)])
    cli("run", "--config", config_b)
    produce_at(topic, 1, [at(event(1, 1), BASE + 1000)])
    result = run_ingest(settings_b)
    assert (result.records_read, result.rows_written) == (1, 0), result
    cli("run", "--config", config_a)
    assert status(f"{name}_a") == status(f"{name}_b") == ("v2", 0, 0)
    assert_upsert_exact(settings_b, topic)


def grown(tmp_path, newer: tuple[bytes, bytes | None]) -> dict:
    """Key 1 `v0` (and key 2) in partition 0, run; the topic grows to 2 partitions;
    ``newer`` for key 1 in partition 1, one second later, run. What the tests check: name,
    topic, config, settings, the tables after the second run (``after``) and its log
    (``grew``)."""
    name = unique("grow")
    topic = create_topic(name, 1)
    config, settings = pipeline(tmp_path, name, topic)
    produce_at(topic, 0, [at(event(1, 0), BASE), at(event(2, 0), BASE)])
    cli("run", "--config", config)
    assert status(name) == ("v0", 0, 0)
    grow(topic, 2)
    produce_at(topic, 1, [at(newer, BASE + 1000)])
    grew = cli("run", "--config", config)
    return dict(name=name, topic=topic, config=config, settings=settings,
                after=snapshot(name), grew=grew)


def grown_then_rewound(tmp_path, newer: tuple[bytes, bytes | None]) -> dict:
    """``grown``, then `offsets set --partition 0 --to earliest` and a run that re-reads
    partition 0 (its result: ``reread``)."""
    g = grown(tmp_path, newer)
    cli("offsets", "set", "--config", g["config"], "--topic", g["topic"], "--partition", "0",
        "--to", "earliest", "--yes")
    assert stored_offsets(g["name"]) == {(g["topic"], 0): 0, (g["topic"], 1): 1}
    return {**g, "reread": run_ingest(g["settings"])}


def assert_reread_changed_nothing(g: dict) -> None:
    assert snapshot(g["name"]) == g["after"]  # not one row or tombstone rewritten
    assert_upsert_exact(g["settings"], g["topic"])
    r = g["reread"]
    assert (r.records_read, r.rows_written, r.rows_deleted) == (2, 0, 0), r
    # Detected, though nothing depends on it.
    assert f"topic {g['topic']} grew: partitions [1] are new to the pipeline (it had read " \
           "[0]); an upsert key found in two partitions keeps the record the ordering rule " \
           "puts last" in g["grew"], g["grew"][-3000:]


def test_rereading_the_old_partition_after_growth_keeps_the_newer_row(spark, tmp_path):
    """Before: the re-read of partition 0 put `v0` back over partition 1's `v1`."""
    g = grown_then_rewound(tmp_path, event(1, 1))
    assert status(g["name"]) == ("v1", 1, 0)
    assert_reread_changed_nothing(g)


def test_rereading_the_old_partition_after_growth_keeps_a_deleted_key_deleted(spark, tmp_path):
    """Before: the re-read of partition 0 brought key 1, deleted by partition 1's
    tombstone, back as `v0`."""
    g = grown_then_rewound(tmp_path, tombstone(1))
    name = g["name"]
    assert status(name) is None and status(name, 2) == ("v0", 0, 1)
    assert query(f'SELECT order_id, "partition", "offset" FROM {name}_deleted') == [(1, 1, 0)]
    assert_reread_changed_nothing(g)


def test_a_backfill_or_reprocess_after_growth_changes_nothing(spark, tmp_path):
    """Of partition 0 alone, and of the whole topic (both partitions in one run). Before:
    the whole-topic backfill and reprocess stopped with exit 3 ("in both T[0] and T[1]")."""
    for newer in (event(1, 1), tombstone(1)):
        g = grown(tmp_path, newer)
        name, topic = g["name"], g["topic"]
        old = [OffsetRange(topic, 0, 0, 2)]
        cli("backfill", "--config", g["config"], "--topic", topic, "--partition", "0",
            "--from-offset", "0", "--to-offset", "2")
        assert snapshot(name) == g["after"]
        for ranges in (old, [*old, OffsetRange(topic, 1, 0, 1)]):
            for reprocess in (False, True):
                before = snapshot(name)
                result = run_backfill(g["settings"], ranges, reprocess=reprocess)
                what = (ranges, reprocess)
                assert result.status == "succeeded", (what, result)
                assert status(name) == (None if newer[1] is None else ("v1", 1, 0)), what
                if not reprocess:  # a reprocess derives its ranges' rows again
                    assert (result.rows_written, result.rows_deleted) == (0, 0), (what, result)
                    assert snapshot(name) == before, what
        assert_upsert_exact(g["settings"], topic)
