"""The bad-input catalogue: every kind of surprising record or topic has a defined outcome
(a result row, a dead letter of a named type, or a one-line error with its exit code), and
the offsets always end where the plan said. In-process on the shared SparkSession."""

from __future__ import annotations

import base64
import json
import shlex
import time
from dataclasses import replace

import psycopg
import pytest
from confluent_kafka import Producer
from confluent_kafka.admin import NewPartitions

from pipeline.cli import main as cli_main
from pipeline.driver.backfill import run_backfill
from pipeline.driver.job import run_ingest
from pipeline.errors import ConfigError, DataError, TransientError
from pipeline.plan.offsets import OffsetRange
from pipeline.store import Store
from tests.helpers import (
    BOOTSTRAP,
    JSON_COLUMNS,
    TEST_DB_URL,
    admin,
    cli_here,
    create_topic,
    delete_records,
    job_db_url,
    make_settings,
    order,
    produce,
    produce_orders,
    query,
    recreate_topic,
    toml_config,
    unique,
    wait_until,
)
from tests.integration._reliability import (
    assert_exactly_once,
    assert_nothing_committed,
    end_offsets,
    init_db,
    kafka_records,
    runs,
    staging_tables,
    start_paused,
    stored,
    wrong_content,
)

MB = 1024 * 1024


BINARY_HEADERS = [("bin", bytes(range(256))), ("empty", b""), ("none", None),
                  ("utf8", "é✓".encode())]

# offset -> (key, value, headers, outcome in the json sink: "row" or the dead-letter type)
CATALOGUE = [
    (b"k0", order(0), None, "row"),
    (b"k1", b"{not json", None, "malformed_json"),
    (b"k2", b'{"order_id": "seven", "customer": "c2"}', None, "wrong_type"),
    (b"k3", b'{"order_id": 3, "customer": 5}', None, "wrong_type"),  # number for a string
    (b"k4", b'{"amount": 3.5}', None, "missing_field"),
    (b"k5", b'{"order_id": null, "customer": "c5"}', None, "missing_field"),
    (b"k6", b"[1, 2, 3]", None, "not_an_object"),
    (b"k7", None, None, "null_value"),  # tombstone
    (None, order(8), None, "row"),  # null key
    (b"k9", b"\xff\xfe\x00 not utf-8", None, "invalid_utf8"),
    (b"k10", order(10, customer="x" * MB), None, "row"),  # a 1 MB record
    (b"k11", order(11), BINARY_HEADERS, "row"),
    (b"k12", b"", None, "malformed_json"),  # empty value, not null
    (b"k13", b"null", None, "not_an_object"),  # JSON null literal
    (b"k14", order(14, amount=1e20), None, "wrong_type"),  # overflows decimal(12,2)
    (b"k15", order(15, placed_at="yesterday"), None, "wrong_type"),
    (b"k16", order(16, extra={"nested": [1]}), None, "row"),  # unknown fields are ignored
    # Rounded half up to the declared scale; a time with an offset stored as its UTC instant.
    (b"k17", order(17, amount=1.005, placed_at="2026-03-08T01:30:00-05:00"), None, "row"),
    (b"k18", order(18, amount="2.5", placed_at="2026-11-01 01:30:00"), None, "row"),
    (b"k19", order(19, amount=99999999999.995), None, "wrong_type"),  # rounds past (12,2)
    # Python accepts an offset up to 23:59, Postgres only up to 15:59: stored as UTC, not a
    # COPY that fails on every rerun.
    (b"k20", order(20, placed_at="2026-01-01T00:00:00+16:00"), None, "row"),
]
# What Postgres must hold for the rows above (amount, placed_at in UTC).
STORED = {17: ("1.01", "2026-03-08 06:30:00+00"), 18: ("2.50", "2026-11-01 01:30:00+00"),
          20: ("1.50", "2025-12-31 08:00:00+00")}
# Both paths are held to the same outcomes: the built-in sink's (records read and parsed in
# Python on the executors) and a transform's (the same read and decode as a DataFrame).
PATHS = [None, "tests.integration.transforms.orders:identity"]


@pytest.fixture(scope="module")
def catalogue_topic(stack):
    """One partition, so that each record's offset is its index in CATALOGUE. The topic
    accepts records up to 2 MB (the broker default is ~1 MB)."""
    topic = create_topic(unique("catalogue"), 1, **{"max.message.bytes": str(2 * MB)})
    p = Producer({"bootstrap.servers": BOOTSTRAP, "message.max.bytes": 3 * MB,
                  "enable.idempotence": True})
    for key, value, headers, _ in CATALOGUE:
        p.produce(topic, key=key, value=value, headers=headers, partition=0)
        p.flush(30)  # one at a time: offsets in catalogue order
    assert p.flush(30) == 0
    assert end_offsets(topic, BOOTSTRAP) == {0: len(CATALOGUE)}
    return topic


@pytest.mark.parametrize("transform", PATHS, ids=["builtin", "transform"])
def test_json_sink_turns_each_bad_record_into_a_typed_dead_letter(spark, catalogue_topic,
                                                                  transform):
    s = init_db(make_settings(unique("cat_json"), [catalogue_topic],
                              sink={"transform": transform} if transform else None))

    result = run_ingest(s)

    expected_rows = [o for o, c in enumerate(CATALOGUE) if c[3] == "row"]
    expected_dead = {o: c[3] for o, c in enumerate(CATALOGUE) if c[3] != "row"}
    assert result.status == "succeeded"
    assert (result.records_read, result.rows_written, result.dead_letters) == (
        len(CATALOGUE), len(expected_rows), len(expected_dead))
    rows = query(f'SELECT "offset", order_id, length(customer) FROM {s.sink.table} '
                 'ORDER BY 1')
    assert [r[0] for r in rows] == expected_rows
    assert {r[0]: r[1] for r in rows} == {o: o for o in expected_rows}
    assert dict((r[0], r[2]) for r in rows)[10] == MB  # the 1 MB record, whole
    assert {r[0]: (str(r[1]), r[2]) for r in query(
        f"SELECT \"offset\", amount, to_char(placed_at AT TIME ZONE 'UTC', "
        f"'YYYY-MM-DD HH24:MI:SS+00') FROM {s.sink.table} WHERE \"offset\" IN (17, 18, 20)")
    } == STORED
    dead = query('SELECT "offset", error_type, error_message, key, value FROM '
                 "pipeline_dead_letters WHERE pipeline = %s ORDER BY 1", (s.name,))
    assert {d[0]: d[1] for d in dead} == expected_dead
    for offset, _, message, key, value in dead:
        assert message, offset
        # The original record is kept byte for byte, for inspection and replay.
        assert (key, value) == CATALOGUE[offset][:2]
    assert stored(s.name, s.database_url) == {0: len(CATALOGUE)}
    assert_exactly_once(s, catalogue_topic, good=lambda r: r[:2] in {
        CATALOGUE[o][:2] for o in expected_rows}, bad=True)


@pytest.mark.parametrize("transform", PATHS, ids=["builtin", "transform"])
def test_raw_sink_keeps_every_record_byte_for_byte_with_headers_as_base64(spark,
                                                                          catalogue_topic,
                                                                          transform):
    s = init_db(make_settings(unique("cat_raw"), [catalogue_topic], fmt="raw",
                              sink={"transform": transform} if transform else None))

    result = run_ingest(s)

    assert (result.records_read, result.rows_written, result.dead_letters) == (
        len(CATALOGUE), len(CATALOGUE), 0)
    rows = query(f'SELECT "offset", key, value, headers FROM {s.sink.table} ORDER BY 1')
    assert [r[0] for r in rows] == list(range(len(CATALOGUE)))
    for offset, key, value, headers in rows:
        want_key, want_value, want_headers, _ = CATALOGUE[offset]
        assert (key, value) == (want_key, want_value), offset  # null key/value stay NULL
        decoded = [(h["key"], None if h.get("value_b64") is None
                    else base64.b64decode(h["value_b64"])) for h in headers]
        assert decoded == (want_headers or []), offset
    assert_exactly_once(s, catalogue_topic)


def test_a_nul_that_postgres_cannot_store_is_a_dead_letter_not_a_stuck_run(spark):
    # A header key with a NUL (which jsonb refuses) is unit-tested (test_encode.py): no
    # librdkafka producer can write one, its header names are C strings.
    topic = create_topic(unique("nul"), 1)
    produce(topic, [(b"a", order(0)),
                    (b"b", b'{"order_id": 1, "customer": "nul\\u0000inside"}'),
                    (b"c", order(2))], partition=0)
    s = init_db(make_settings(unique("nul"), [topic]))

    result = run_ingest(s)

    assert result.status == "succeeded"
    assert (result.records_read, result.rows_written, result.dead_letters) == (3, 2, 1)
    [(offset, error_type, message, value)] = query(
        'SELECT "offset", error_type, error_message, value FROM pipeline_dead_letters '
        "WHERE pipeline = %s", (s.name,))
    assert (offset, error_type) == (1, "unstorable") and "NUL" in message
    assert value == b'{"order_id": 1, "customer": "nul\\u0000inside"}'  # kept byte for byte
    assert sorted(o for (o,) in query(f'SELECT "offset" FROM {s.sink.table}')) == [0, 2]
    assert stored(s.name, s.database_url) == {0: 3}


def test_empty_topic_is_a_noop_and_later_records_are_read_from_offset_0(spark):
    topic = create_topic(unique("empty"), 2)
    s = init_db(make_settings(unique("empty"), [topic]))

    first = run_ingest(s)

    assert first.status == "noop" and first.records_read == 0
    assert stored(s.name, s.database_url) == {}
    produce_orders(topic, range(10))
    second = run_ingest(s)
    assert second.status == "succeeded" and second.rows_written == 10
    assert all(item["from"] == 0 for item in second.plan)
    assert_exactly_once(s, topic)


def test_unknown_topic_is_a_clear_error_with_exit_3(stack, tmp_path):
    missing, name = unique("nosuch"), unique("unknown")
    config = tmp_path / "c.toml"
    config.write_text(toml_config(name, [missing]))
    init_db(make_settings(name, [missing]))

    r = cli_here("run", "--config", str(config),
                env={"PIPELINE__KAFKA__BOOTSTRAP_SERVERS": BOOTSTRAP,
                     "PIPELINE__DATABASE__URL": job_db_url()})

    assert r.returncode == 3, r.stderr
    assert r.stderr.strip().splitlines()[-1] == (
        f"error: topic '{missing}' does not exist on {BOOTSTRAP}; create it or fix "
        "kafka.topics")
    assert runs(name, make_settings(name, [missing]).database_url) == []


def test_partitions_added_between_runs_are_read_from_earliest(spark):
    topic = create_topic(unique("grow"), 2)
    produce_orders(topic, range(40))
    s = init_db(make_settings(unique("grow"), [topic]))
    assert run_ingest(s).status == "succeeded"

    client = admin()
    client.create_partitions([NewPartitions(topic, 4)])[topic].result()
    wait_until(lambda: len(end_offsets(topic, BOOTSTRAP)) == 4, "the new partitions")
    # The admin client's list_offsets may still find no leader for a brand-new partition
    # (a transient error, exit 75, in a real run): wait until it answers.
    wait_until(lambda: offsets_listed(s, topic, 4), "offsets of the new partitions")
    produce_orders(topic, range(40, 100))  # keyed: spread over all four partitions
    result = run_ingest(s)

    new = [item for item in result.plan if item["partition"] >= 2]
    assert [(i["stored"], i["from"]) for i in new] == [(None, 0), (None, 0)]
    assert all(i["offsets"] > 0 for i in new)
    assert_exactly_once(s, topic)
    assert sorted(r[0] for r in query(f"SELECT order_id FROM {s.sink.table}")) == list(
        range(100))


def recreated_pipeline(new_records: int = 10):
    """A pipeline that read 30 records of a topic, which was then deleted and created again
    with ``new_records`` new records (order ids from 100)."""
    topic = create_topic(unique("recreated"), 1)
    produce_orders(topic, range(30))
    s = init_db(make_settings(unique("recreated"), [topic]))
    run_ingest(s)
    assert stored(s.name, s.database_url) == {0: 30}
    old_id = topic_id(topic)
    recreate_topic(topic, 1)
    produce_orders(topic, range(100, 100 + new_records))
    return s, topic, old_id


def topic_id(topic: str) -> str:
    from confluent_kafka import TopicCollection

    client = admin()  # kept alive until the answer is in
    return str(client.describe_topics(TopicCollection([topic]))[topic].result().topic_id)


# 10 new records: fewer than the stored offset 30 (they used to be dropped as "already
# there" after the reset); 50: more (offsets [0, 30) of the new topic used to be skipped
# with no error at all).
@pytest.mark.parametrize("new_records", [10, 50])
def test_topic_deleted_and_recreated_is_a_clear_error_naming_the_fix(spark, new_records):
    s, topic, old_id = recreated_pipeline(new_records)

    with pytest.raises(DataError) as e:
        run_ingest(s)

    assert e.value.exit_code == 3
    message = e.value.message
    assert (f"topic '{topic}' was deleted and recreated: the stored offsets belong to topic "
            f"ID {old_id}, Kafka's '{topic}' is now {topic_id(topic)}") in message
    assert f"run 'pipeline offsets reset --topic {topic} --to earliest'" in message
    assert stored(s.name, s.database_url) == {0: 30}  # nothing moved
    assert [r[1:3] for r in runs(s.name, s.database_url)] == [("succeeded", 0)]


def test_following_the_named_fix_after_a_recreated_topic_ingests_the_new_records(
        spark, tmp_path, monkeypatch):
    monkeypatch.setenv("PIPELINE__KAFKA__BOOTSTRAP_SERVERS", BOOTSTRAP)
    for old in ("KAFKA_BOOTSTRAP_SERVERS", "PIPELINE_DATABASE_URL", "PIPELINE__DATABASE__URL"):
        monkeypatch.delenv(old, raising=False)
    s, topic, old_id = recreated_pipeline()
    with pytest.raises(DataError) as e:
        run_ingest(s)
    fix = e.value.message.split("run '", 1)[1].split("'", 1)[0]
    config = tmp_path / "c.toml"
    config.write_text(toml_config(s.name, [topic]))

    assert cli_main([*shlex.split(fix)[1:], "--config", str(config), "--yes"]) == 0
    result = run_ingest(s)

    assert stored(s.name, s.database_url) == {0: 10}
    assert result.records_read == 10
    assert result.rows_written == 10, "the recreated topic's records were not written"
    # The new topic's rows, each the record at its offset; the old topic's rows archived
    # (reachable, with the topic ID they came from), not mixed with the new ones.
    assert query(f'SELECT "offset", order_id FROM {s.sink.table} ORDER BY 1') == [
        (i, 100 + i) for i in range(10)]
    assert query(f'SELECT "offset", order_id, topic_id FROM {s.sink.table}_archived '
                 "ORDER BY 1") == [(i, i, old_id) for i in range(30)]
    [(ids,)] = query("SELECT details->'topic_ids' FROM pipeline_runs WHERE run_id = %s",
                     (result.run_id,))
    assert ids == {topic: topic_id(topic)}


def test_a_topic_recreated_while_the_run_read_it_commits_nothing(stack, tmp_path):
    topic = create_topic(unique("recreated_mid"), 1)
    produce_orders(topic, range(20))
    name = unique("recreated_mid")
    init_db(make_settings(name, [topic]))
    config = tmp_path / "c.toml"
    config.write_text(toml_config(name, [topic]))
    # Read, staged, about to publish: the topic is recreated with other records meanwhile.
    run = start_paused("run", "--config", str(config), point="after_stage", seconds=15)
    recreate_topic(topic, 1)
    produce_orders(topic, range(200, 220))
    err = run.stderr.read()
    run.wait(timeout=120)

    assert run.returncode == 3, err
    assert f"topic '{topic}' was deleted and recreated: the planned ranges belong" in err
    assert stored(name, TEST_DB_URL) == {}
    assert query(f"SELECT count(*) FROM {name}") == [(0,)]


def test_records_deleted_before_they_were_read_fail_or_are_skipped_and_recorded(spark):
    topic = create_topic(unique("deleted"), 1)
    produce_orders(topic, range(20))
    fail = init_db(make_settings(unique("loss_fail"), [topic]))
    skip = init_db(make_settings(unique("loss_skip"), [topic],
                                 kafka={"on_data_loss": "skip"}))
    run_ingest(fail)
    run_ingest(skip)

    delete_records(topic, 0, 5)  # below the stored offset 20: already read, no loss
    assert run_ingest(fail).status == "noop"
    produce_orders(topic, range(20, 40))
    delete_records(topic, 0, 30)  # [20, 30) deleted before any pipeline read it

    with pytest.raises(DataError) as e:
        run_ingest(fail)
    assert e.value.exit_code == 3
    assert f"data loss: {topic}[0] offsets [20, 30) were deleted" in e.value.message
    assert "on_data_loss = 'skip'" in e.value.message
    assert stored(fail.name, fail.database_url) == {0: 20}

    result = run_ingest(skip)
    assert result.status == "succeeded"
    assert result.lost == [{"topic": topic, "partition": 0, "from": 20, "until": 30,
                            "offsets": 10}]
    [(lost,)] = query("SELECT lost FROM pipeline_runs WHERE run_id = %s", (result.run_id,))
    assert lost == [{"topic": topic, "partition": 0, "from": 20, "until": 30}]
    assert sorted(r[0] for r in query(f"SELECT order_id FROM {skip.sink.table}")) == list(
        range(20)) + list(range(30, 40))
    assert stored(skip.name, skip.database_url) == {0: 40}


@pytest.fixture(scope="module")
def compacted_topic(stack):
    """A topic the log cleaner really compacted (shared: waiting for the cleaner is the
    slow part): (topic, its end offset, the offsets that survived the first compaction)."""
    topic = create_topic(unique("compact"), 1, **{
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "100", "min.compaction.lag.ms": "0"})
    for batch in range(6):  # several closed segments, ten keys overwritten again and again
        produce(topic, [(f"key-{i % 10}".encode(), order(batch * 100 + i))
                        for i in range(30)], partition=0)
        time.sleep(0.3)
    produce(topic, [(b"roll", order(999))], partition=0)  # rolls the last full segment
    end = end_offsets(topic, BOOTSTRAP)[0]
    assert end == 181
    held = wait_until(lambda: (r := kafka_records(topic, BOOTSTRAP)) and len(r) < end and r,
                      "the log cleaner to compact the topic", timeout=90)
    return topic, end, sorted(o for _, o in held)


@pytest.mark.parametrize("transform", PATHS, ids=["builtin", "transform"])
def test_compacted_topic_gaps_are_passed_and_offsets_end_at_the_plan(spark, transform,
                                                                     compacted_topic):
    topic, end, offsets = compacted_topic
    gaps = [o for o in range(end) if o not in set(offsets)]
    assert gaps
    # Small runs, so that ranges start and end inside compacted gaps.
    s = init_db(make_settings(unique("compact"), [topic],
                              kafka={"max_records_per_partition": 15},
                              sink={"transform": transform} if transform else None))

    ends = []
    while (result := run_ingest(s)).status != "noop":
        ends.append(result.plan[0]["until"])
        assert stored(s.name, s.database_url) == {0: ends[-1]}
    assert ends[-1] == end and any(o in gaps for o in ends[:-1])
    # The cleaner may still be removing records: every record Kafka holds now landed, and
    # nothing landed that Kafka did not hold before the runs began.
    rows = {o for (o,) in query(f'SELECT "offset" FROM {s.sink.table}')}
    assert {o for _, o in kafka_records(topic, BOOTSTRAP)} <= rows <= set(offsets)
    assert len(rows) == len(query(f"SELECT 1 FROM {s.sink.table}"))


@pytest.mark.parametrize("transform", PATHS, ids=["builtin", "transform"])
def test_transactions_only_committed_records_land_and_offsets_stop_at_the_lso(spark,
                                                                             transform):
    topic = create_topic(unique("txn"), 1)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": unique("txid")})
    p.init_transactions(30)

    def txn(ids, commit: bool | None):
        p.begin_transaction()
        for i in ids:
            p.produce(topic, key=f"order-{i}".encode(), value=order(i), partition=0)
        p.flush(30)
        if commit is True:
            p.commit_transaction(30)
        elif commit is False:
            p.abort_transaction(30)

    txn(range(0, 10), True)
    txn(range(100, 110), False)  # aborted: never lands
    txn(range(10, 20), True)
    txn(range(20, 30), None)  # still open: the last stable offset stops before it
    s = init_db(make_settings(unique("txn"), [topic],
                              sink={"transform": transform} if transform else None))

    first = run_ingest(s)

    lso = end_offsets(topic, BOOTSTRAP)[0]
    high = end_offsets(topic, BOOTSTRAP, "read_uncommitted")[0]
    assert lso < high
    assert first.rows_written == 20 and first.dead_letters == 0
    assert stored(s.name, s.database_url) == {0: lso}
    assert sorted(r[0] for r in query(f"SELECT order_id FROM {s.sink.table}")) == list(
        range(20))

    p.commit_transaction(30)
    second = run_ingest(s)

    assert second.rows_written == 10
    final = end_offsets(topic, BOOTSTRAP)[0]
    last_record = max(o for _, o in kafka_records(topic, BOOTSTRAP))
    assert final > last_record + 1  # a commit marker ends the log: offsets pass it
    assert stored(s.name, s.database_url) == {0: final}
    assert sorted(r[0] for r in query(f"SELECT order_id FROM {s.sink.table}")) == list(
        range(30))
    assert_exactly_once(s, topic, bad=True)


@pytest.mark.parametrize("transform", PATHS, ids=["builtin", "transform"])
def test_retention_right_after_a_complete_read_keeps_what_was_read(stack, tmp_path,
                                                                   transform):
    """Records read in full and then deleted by retention before the publish were read:
    the run commits them (it used to be discarded as "deleted during the read", and the next
    run then reported a loss of data it had read)."""
    topic = create_topic(unique("retained"), 1)
    produce_orders(topic, range(60))
    records = kafka_records(topic, BOOTSTRAP)
    name = unique("retained")
    init_db(make_settings(name, [topic]))
    config = tmp_path / "c.toml"
    config.write_text(toml_config(name, [topic], extra_sink=(
        f'transform = "{transform}"' if transform else "")))
    # Read and staged; not yet published.
    run = start_paused("run", "--config", str(config), "--json", point="after_stage",
                       seconds=8)
    delete_records(topic, 0, 50)
    out, err = run.communicate(timeout=120)

    assert run.returncode == 0, err[-3000:]
    assert json.loads(out.strip().splitlines()[-1])["rows_written"] == 60
    assert stored(name, TEST_DB_URL) == {0: 60}
    s = make_settings(name, [topic])
    assert wrong_content(s, records) == []
    assert len(query(f"SELECT 1 FROM {name}")) == 60


def test_records_deleted_ahead_of_the_reader_fail_the_read_and_the_loss_is_reported(
        spark, tmp_path):
    """Retention deletes offsets the reader has not reached yet (tiny fetches, and the task
    paused after its first batch): the read stops (exit 75, nothing committed) instead of
    jumping over them, and the next run reports exactly the offsets that were lost."""
    topic = create_topic(unique("ahead"), 1)
    produce_orders(topic, range(100))
    s = init_db(make_settings(unique("ahead"), [topic]))
    run_ingest(s)
    produce_orders(topic, range(100, 50_100))  # far more than one batch of the reader
    config = tmp_path / "c.toml"
    config.write_text(toml_config(s.name, [topic], extra_kafka=(
        '[kafka.consumer]\n"queued.min.messages" = "1"\n"fetch.max.bytes" = "1024"\n'
        '"max.partition.fetch.bytes" = "1024"\n"message.max.bytes" = "1000"\n')))
    # The task staged its first batch and sleeps.
    run = start_paused("run", "--config", str(config), point="during_read", seconds=10)
    delete_records(topic, 0, 40_000)
    err = run.stderr.read()
    run.wait(timeout=120)

    assert run.returncode == 75, err[-3000:]
    assert f"{topic}[0] [100, 50100): offset" in err and "is no longer in Kafka" in err
    assert stored(s.name, s.database_url) == {0: 100}
    with pytest.raises(DataError) as e:
        run_ingest(s)
    assert f"data loss: {topic}[0] offsets [100, 40000) were deleted" in e.value.message


@pytest.mark.parametrize("transform", PATHS, ids=["builtin", "transform"])
def test_a_log_that_ends_before_the_planned_end_is_exit_3_and_commits_nothing(spark,
                                                                             transform):
    """A truncated log (an unclean leader election moves the end back below what was
    planned; one broker cannot do that, so the plan is made beyond the end instead): the
    read is a permanent error naming the range, never a silent short read."""
    topic = create_topic(unique("truncated"), 1)
    produce_orders(topic, range(20))
    s = init_db(make_settings(unique("truncated"), [topic], kafka={"timeout_seconds": 3},
                              sink={"transform": transform} if transform else None))

    with pytest.raises(DataError) as e:
        run_backfill(s, [OffsetRange(topic, 0, 10, 30)])

    assert e.value.exit_code == 3
    assert (f"{topic}[0] [10, 30): the partition now ends at offset 20, before the planned "
            "end") in e.value.message
    assert query(f"SELECT count(*) FROM {s.sink.table}") == [(0,)]
    assert [r[1:3] for r in runs(s.name, s.database_url)] == [("failed", 3)]


def test_too_many_bad_records_exit_3_and_commit_nothing(spark):
    topic = create_topic(unique("toobad"), 2)
    produce_orders(topic, range(20))
    produce(topic, [(b"b1", b"{"), (b"b2", b"[]"), (b"b3", None)])
    s = init_db(make_settings(unique("toobad"), [topic], sink={"max_bad_records": 2}))

    with pytest.raises(DataError) as e:
        run_ingest(s)

    assert e.value.exit_code == 3
    assert "3 bad records" in e.value.message
    assert "exceed sink.max_bad_records = 2; nothing committed" in e.value.message
    assert_nothing_committed(s)
    [(_, status, exit_code, _)] = runs(s.name, s.database_url)
    assert (status, exit_code) == ("failed", 3)
    assert staging_tables(s.name, s.database_url) == []
    # Raising the limit is the documented way on.
    raised = replace(s, sink=replace(s.sink, max_bad_records=3))
    assert run_ingest(raised).dead_letters == 3
    assert_exactly_once(raised, topic, good=lambda r: r[0].startswith(b"order-"), bad=True)


def test_a_crashed_runs_staging_is_dropped_for_the_longest_pipeline_name(spark):
    """A 48-character name (the longest allowed) once made staging names over Postgres's
    63 bytes: truncated, they escaped the cleanup and could collide between runs."""
    topic = create_topic(unique("longname"), 1)
    produce_orders(topic, range(50))
    s = init_db(make_settings((unique("l") + "_" + "x" * 48)[:48], [topic]))
    crashed = Store(s)  # a run that died after creating its staging table
    crashed.staging.create(crashed.runs.start("ingest", []))
    crashed.close()

    result = run_ingest(s)

    assert (result.status, result.rows_written) == ("succeeded", 50)
    assert staging_tables(s.name, s.database_url) == []
    assert [r[1] for r in runs(s.name, s.database_url)] == ["abandoned", "succeeded"]


def test_a_results_table_that_drifted_from_the_config_is_exit_2_before_reading(spark):
    topic = create_topic(unique("drift"), 1)
    produce_orders(topic, range(5))
    s = init_db(make_settings(unique("drift"), [topic]))
    alter(f"ALTER TABLE {s.sink.table} DROP COLUMN amount, ALTER COLUMN customer TYPE integer "
          "USING 0, ADD COLUMN note text NOT NULL")

    with pytest.raises(ConfigError) as e:
        run_ingest(s)

    assert e.value.exit_code == 2
    assert "column amount is missing" in e.value.message
    assert "column customer is integer, the config writes text" in e.value.message
    assert "column note is NOT NULL without a default" in e.value.message
    assert (f'ALTER TABLE "public"."{s.sink.table}" ALTER COLUMN "customer" TYPE text, '
            'ADD COLUMN "amount" numeric(12,2), ALTER COLUMN "note" DROP NOT NULL'
            ) in e.value.message
    assert runs(s.name, s.database_url) == []  # refused before any run started
    # The fix the error names works.
    alter(f'ALTER TABLE "public"."{s.sink.table}" ADD COLUMN "amount" numeric(12,2), '
          'ALTER COLUMN "customer" TYPE text, ALTER COLUMN "note" DROP NOT NULL')
    assert run_ingest(s).rows_written == 5


def alter(statement: str) -> None:
    with psycopg.connect(TEST_DB_URL, autocommit=True) as conn:
        conn.execute(statement)


def test_reprocess_replaces_what_the_range_held(spark):
    """A record that was a result and is now a dead letter, or that a changed transform
    filters out, keeps no old row; no offset is left in both tables."""
    topic = create_topic(unique("reproc"), 1)
    # Odd orders have no amount: results while amount is optional.
    produce(topic, [(f"k{i}".encode(), json.dumps(
        {"order_id": i, "customer": f"c{i}", **({"amount": 1.5} if i % 2 == 0 else {})}
    ).encode()) for i in range(12)], partition=0)
    name = unique("reproc")
    s = init_db(make_settings(name, [topic]))
    assert run_ingest(s).rows_written == 12
    everything = [OffsetRange(topic, 0, 0, 12)]

    # Now amount is required: the odd records become dead letters.
    required = make_settings(name, [topic], sink={"columns": {
        **JSON_COLUMNS, "amount": "decimal(12,2) not null"}})
    result = run_backfill(required, everything, reprocess=True)

    assert (result.rows_written, result.dead_letters) == (6, 6)
    assert [r[0] for r in query(f"SELECT order_id FROM {s.sink.table} ORDER BY 1")] == list(
        range(0, 12, 2))
    dead = query('SELECT "offset", error_type FROM pipeline_dead_letters WHERE pipeline = %s '
                 "ORDER BY 1", (name,))
    assert dead == [(o, "missing_field") for o in range(1, 12, 2)]

    # A changed transform drops order 10 and doubles amounts; amount optional again: the
    # odd records are results once more and leave the dead letters.
    transformed = make_settings(name, [topic], sink={
        "transform": "tests.integration.transforms.orders:double_amount"})
    again = run_backfill(transformed, everything, reprocess=True)

    rows = query(f"SELECT order_id, amount FROM {s.sink.table} ORDER BY 1")
    assert [r[0] for r in rows] == [i for i in range(12) if i % 10 != 0]
    assert {str(r[1]) for r in rows if r[0] % 2 == 0} == {"3.00"}
    assert query("SELECT count(*) FROM pipeline_dead_letters WHERE pipeline = %s",
                 (name,)) == [(0,)]
    # Moved out as a replay moves them, by the transaction that wrote their rows.
    assert query('SELECT "offset", replayed_run_id FROM pipeline_dead_letters_replayed WHERE '
                 "pipeline = %s ORDER BY 1", (name,)) == [(o, again.run_id)
                                                          for o in range(1, 12, 2)]
    assert stored(name, s.database_url) == {0: 12}  # reprocess never moves offsets


# ---- helpers -----------------------------------------------------------------------------
def offsets_listed(s, topic: str, partitions: int) -> bool:
    from pipeline.driver.kafka_meta import KafkaMeta

    try:
        return len(KafkaMeta(s.kafka).offsets([(topic, p) for p in range(partitions)])) == 4
    except TransientError:
        return False
