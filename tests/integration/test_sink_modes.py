"""The upsert and aggregate sinks against the real stack: the table always equals what a
recomputation from Kafka says it must (the newest record per key, or the totals of every
committed record), after several runs, replays, tombstones and SIGKILLs at every fault
point."""

from __future__ import annotations

import json
from collections import defaultdict
from decimal import Decimal

import pytest

from pipeline import faults
from pipeline.config import load_settings
from pipeline.driver.backfill import run_backfill
from pipeline.driver.job import run_ingest
from pipeline.errors import ConfigError, DataError
from pipeline.plan.offsets import OffsetRange
from tests.helpers import (
    BOOTSTRAP,
    cli_here,
    create_topic,
    init_db,
    make_settings,
    produce,
    query,
    stored_offsets,
    unique,
)
from tests.integration._reliability import finish, one_error_line, start_paused
from tests.integration._sink_modes import (
    UPSERT,
    aggregate_config,
    aggregate_settings,
    assert_same,
    assert_upsert_exact,
    committed,
    event,
    expected_totals,
    killed_then_rerun,
    table_state,
    table_totals,
    tombstone,
    upsert_config,
    upsert_settings,
)

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
    config = upsert_config(tmp_path, name, topic)
    settings = load_settings(config, environ={})
    produce(topic, [event(1, 0), event(2, 0)])
    run_ingest(settings)
    produce(topic, [tombstone(1)])
    ingest = start_paused("run", "--config", config, point="before_commit", seconds=8)
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


def test_aggregate_pipeline_refuses_backfill_reprocess_and_rewind(spark, tmp_path):
    name = unique("aggr")
    topic = create_topic(name, 1)
    config = aggregate_config(tmp_path, name, topic)
    produce(topic, [event(k, 0) for k in range(10)])
    r = cli_here("run", "--config", config)
    assert r.returncode == 0, r.stderr[-2000:]
    before = query(f"SELECT * FROM {name} ORDER BY customer")
    backfill = ["backfill", "--topic", topic, "--from-offset", "0", "--to-offset", "10"]
    for args in (backfill, [*backfill, "--reprocess"],
                 ["offsets", "set", "--topic", topic, "--to", "earliest", "--yes"]):
        r = cli_here(*args, "--config", config)
        assert r.returncode == 2, (args, r.stderr[-2000:])
        line = one_error_line(r.stderr)
        assert "count them again" in line and "TRUNCATE" in line, line
    assert query(f"SELECT * FROM {name} ORDER BY customer") == before
    assert stored_offsets(name) == {(topic, 0): 10}


@pytest.mark.parametrize("mode", ["upsert", "aggregate"])
def test_offsets_reset_of_a_recreated_topic_per_mode(spark, tmp_path, monkeypatch, mode):
    """The named fix of a recreated topic: upsert archives the old topic's rows and drops
    its tombstones (their offsets would hide the new topic's records); aggregate keeps the
    totals, which counted the old topic's records once, and adds the new topic's."""
    from pipeline.cli import main as cli_main
    from tests.helpers import recreate_topic

    monkeypatch.setenv("PIPELINE__KAFKA__BOOTSTRAP_SERVERS", BOOTSTRAP)
    for old in ("KAFKA_BOOTSTRAP_SERVERS", "PIPELINE_DATABASE_URL", "PIPELINE__DATABASE__URL"):
        monkeypatch.delenv(old, raising=False)
    name = unique(f"re{mode[:3]}")
    topic = create_topic(name, 1)
    config = (upsert_config if mode == "upsert" else aggregate_config)(tmp_path, name, topic)
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
    config = (upsert_config if mode == "upsert" else aggregate_config)(tmp_path, name, topic)
    settings = load_settings(config, environ={})

    def assert_exact() -> dict:
        if mode == "upsert":
            return assert_upsert_exact(settings, topic)
        return assert_same(expected_totals(settings, topic), table_totals(name))

    for n, point in enumerate(faults.POINTS):
        killed_then_rerun(settings, topic, config, point, n, mode == "upsert", assert_exact)


# ---- the newest-wins rule, whatever the runs ---------------------------------------------

def _two_topic_config(tmp_path, name: str, topics: list[str]) -> str:
    """An upsert pipeline keyed by order_id over ``topics``, set up through the CLI."""
    from tests.helpers import init_cli, toml_config

    config = tmp_path / f"{name}.toml"
    config.write_text(toml_config(name, topics, extra_sink=(
        'mode = "upsert"\nkey = ["order_id"]')).replace(
        'order_id = "long not null"', 'order_id = "long"\nstatus = "string"'))
    init_cli(config)
    return str(config)


def _cli_ok(*args: str) -> str:
    r = cli_here(*args)
    assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-3000:]}"
    return r.stdout


def test_records_of_two_topics_end_in_the_same_row_however_runs_split_them(spark, tmp_path):
    """Key 1: `vA` in topic X, then `vC` in topic Y stamped a second earlier, then `vB` in X
    stamped two seconds earlier still (X's clock went back). Pipeline `split` reads A and
    C, then B; pipeline `whole` reads all three at once; both must hold the same row, and
    `verify` (which recomputes the state in one go) must find each table exact. Before:
    `split` held B (offsets, X's own order, after A won by its timestamp), `whole` held C
    (B's own timestamp lost to C's), and `verify` of `split` exited 3."""
    from tests.integration.test_partition_growth import BASE, at, produce_at

    name = unique("upso")
    x, y = create_topic(f"{name}_x", 1), create_topic(f"{name}_y", 1)
    split = _two_topic_config(tmp_path, f"{name}_s", [x, y])
    whole = _two_topic_config(tmp_path, f"{name}_w", [x, y])
    produce_at(x, 0, [at(event(1, 0), BASE + 3000)])  # vA
    produce_at(y, 0, [at(event(1, 2), BASE + 2000)])  # vC
    _cli_ok("run", "--config", split)
    assert table_state(f"{name}_s")[1][0] == "v0"
    produce_at(x, 0, [at(event(1, 1), BASE + 1000)])  # vB: X's later record
    _cli_ok("run", "--config", split)
    _cli_ok("run", "--config", whole)
    held = {table_state(f"{name}_{p}")[1][0] for p in "sw"}
    # B is X's newest record, and X's order time is still A's (3 s), later than C's.
    assert held == {"v1"}, held
    for config in (split, whole):
        assert "verified:" in _cli_ok("verify", "--config", config)


def test_a_microseconds_as_milliseconds_timestamp_does_not_pin_a_key(spark, tmp_path):
    """A producer wrote microseconds as milliseconds (a timestamp in the year ~55,000, which
    a topic with message.timestamp.after.max.ms raised, or a broker before Kafka 4, takes).
    Key 1's record `v0` with it in topic X, run; then `v1` in topic Y, stamped now, run:
    `v1` wins (a timestamp past year 9999 orders as none), and `verify` agrees. Within X the
    offsets still order (key 2: `v1` after the far-future `v0`). Before: the far-future
    record beat every record of every other partition or topic, forever."""
    import time

    from tests.integration.test_partition_growth import at, produce_at

    name = unique("upsf")
    x = create_topic(f"{name}_x", 1, **{"message.timestamp.after.max.ms": str(2**63 - 1)})
    y = create_topic(f"{name}_y", 1)
    config = _two_topic_config(tmp_path, name, [x, y])
    now_ms = int(time.time() * 1000)
    produce_at(x, 0, [at(event(1, 0), now_ms * 1000), at(event(2, 0), now_ms * 1000),
                      at(event(2, 1), now_ms)])
    _cli_ok("run", "--config", config)
    produce_at(y, 0, [at(event(1, 1), now_ms + 1000)])
    _cli_ok("run", "--config", config)
    state = table_state(name)
    assert (state[1][0], state[2][0]) == ("v1", "v1"), state
    assert "verified:" in _cli_ok("verify", "--config", config)


def test_an_upsert_table_of_an_older_version_is_upgraded_by_init_db(spark):
    """A table made before the order time was stored (no `_order_time` in it or in its
    `_deleted`): the run stops before reading (exit 2) naming init-db, which adds the
    columns and keeps the rows; a row without an order time is ordered by its own
    timestamp, so the next run's newer record replaces it."""
    name = unique("upsold")
    topic = create_topic(name, 1)
    settings = upsert_settings(name, topic)
    produce(topic, [event(1, 0), event(2, 0)])
    run_ingest(settings)
    from tests.integration._verify import execute

    for table in (name, f"{name}_deleted"):
        execute(f"ALTER TABLE {table} DROP COLUMN _order_time")
    produce(topic, [event(1, 1), tombstone(2)])
    with pytest.raises(ConfigError) as e:
        run_ingest(settings)
    assert f'table "public"."{name}" was made by an older version of the pipeline (no ' \
           f"_order_time): run 'pipeline init-db --config {settings.source}' to upgrade it " \
           "(keeps all data); nothing was read" in e.value.message
    init_db(settings)
    assert query(f"SELECT order_id, _order_time FROM {name} ORDER BY 1") == [(1, None),
                                                                              (2, None)]
    result = run_ingest(settings)
    assert (result.rows_written, result.rows_deleted) == (1, 1), result
    assert_upsert_exact(settings, topic)
