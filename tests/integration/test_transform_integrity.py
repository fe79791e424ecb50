"""The transform path's integrity (issue 23, item 8): a partition staged by two writers that
Spark numbers alike is published once, a transform's second row for one Kafka record is a
clear exit-2 error naming the transform and the record, before anything commits, and staged
blobs are bounded by bytes, not only by records, on both paths."""

from __future__ import annotations

import functools
import json

import psycopg
import pytest

from pipeline.driver.job import run_ingest
from pipeline.driver.kafka_meta import KafkaMeta
from pipeline.driver.publish import Publisher
from pipeline.driver.routing import resolve_routes
from pipeline.errors import ConfigError
from pipeline.executor import task
from pipeline.executor.consume import read_range, reader_config
from pipeline.executor.staging import DEAD, ROW
from pipeline.formats.encode import Encoder
from pipeline.plan.offsets import plan_ranges
from pipeline.store import Store, tables
from pipeline.store.run import Run
from tests.helpers import (
    cli_here,
    create_topic,
    init_cli,
    init_db,
    make_settings,
    produce,
    produce_orders,
    query,
    result_keys,
    run_cli,
    stored_offsets,
    toml_config,
    unique,
)

TRANSFORMS = "tests.integration.transforms.orders"


def stage_as(store: Store, run: Run, writers: list[dict], blobs: list[tuple]) -> None:
    """Write ``blobs`` (topic, partition, n, lo, hi, blob) into a run's staging table once per
    writer, as a Spark task would (same COPY, same column types); a writer names its
    identity columns (part, attempt, task). Only the columns the table has are written."""
    copy_sql, types = run.staging_copy()
    columns = [c.name for c in tables.staging(run.staging_name).columns]
    have = [(c, t) for c, t in zip(columns, types, strict=True)]
    with psycopg.connect(store.url) as conn, conn.cursor() as cur, cur.copy(copy_sql) as copy:
        copy.set_types(types)
        for writer in writers:
            for seq, (topic, partition, n, lo, hi, blob) in enumerate(blobs):
                row = {**writer, "seq": seq, "topic": topic, "partition": partition,
                       "kind": ROW, "n": n, "min_offset": lo, "max_offset": hi, "blob": blob}
                copy.write_row(tuple(row[c] for c, _ in have))


def test_a_partition_staged_again_by_a_resubmitted_stage_is_published_once(stack):
    # Spark resubmits a stage after a shuffle fetch failure and numbers its task attempts
    # from 0 again: a zombie task of the first stage attempt and task 0 attempt 0 of the
    # second both commit blobs for Spark partition 0. Such a fault cannot be produced on a
    # local master; the blobs are staged here exactly as the two task attempts would.
    topic = create_topic(unique("resub"), 1)
    produce_orders(topic, range(10))
    s = init_db(make_settings(unique("resub"), [topic]))
    store = Store(s)
    plan = plan_ranges(store.offsets.load(), KafkaMeta(s.kafka).topic_offsets([topic]))
    (r,) = plan.ranges
    store.locks.lock_or_fail()
    run = store.runs.start("ingest", plan.partitions)
    store.staging.create(run)
    encoder = Encoder(s.sink.format, [(c.name, c.type, c.required) for c in s.sink.columns],
                      run.id)
    reader = reader_config(s.kafka.client_config(), s.kafka.isolation_level, "t-reader")
    blobs = []
    for records in read_range(reader, r, s.kafka.timeout_seconds):
        rows = encoder.encode(r.topic, r.partition, records).rows
        blobs.append((r.topic, r.partition, len(rows), records[0].offset(),
                      records[-1].offset(),
                      b"".join(rows) if encoder.binary else "".join(rows).encode()))
    first_stage, second_stage = {"part": 0, "attempt": 0, "task": 3}, \
        {"part": 0, "attempt": 0, "task": 7}
    stage_as(store, run, [first_stage, second_stage], blobs)

    with Publisher(store, resolve_routes(s, [topic]).tables, run, plan.ranges) as publisher:
        publisher.take()
        published = publisher.finish(plan.offset_updates, {})
    store.close()

    assert published.records_read == 10 and published.rows_written == 10
    assert result_keys(s.sink.table) == [(topic, 0, o) for o in range(10)]
    assert stored_offsets(s.name) == {(topic, 0): 10}


def transform_pipeline(tmp_path, transform: str, records: int = 10) -> tuple[str, str, str]:
    topic = create_topic(unique("dup"), 1)
    produce_orders(topic, range(records))
    name = unique("dup")
    config = tmp_path / "c.toml"
    config.write_text(toml_config(name, [topic], extra_sink=f'transform = "{transform}"'))
    init_cli(config)
    return topic, name, str(config)


def assert_refused_naming(r, transform: str, topic: str, offset: int, name: str) -> None:
    assert r.returncode == 2, r.stderr[-3000:]
    assert f"[sink] transform '{transform}' returned" in r.stderr, r.stderr[-3000:]
    assert f"{topic}[0] offset {offset}" in r.stderr, r.stderr[-3000:]
    assert "one row per Kafka record" in r.stderr


def test_a_transform_returning_two_rows_for_one_record_is_exit_2_naming_it(spark, tmp_path):
    transform = f"{TRANSFORMS}:order_7_twice"
    topic, name, config = transform_pipeline(tmp_path, transform)

    r = cli_here("run", "--config", config)

    # Before: exit 75 "another run published first", and every retry the same.
    assert_refused_naming(r, transform, topic, 7, name)
    assert result_keys(name) == [] and stored_offsets(name) == {}
    assert query("SELECT status, exit_code FROM pipeline_runs WHERE pipeline = %s "
                 "AND kind = 'ingest'", (name,)) == [("failed", 2)]


def test_rows_a_writer_lost_are_never_counted_as_filtered_nothing_commits(stack, tmp_path):
    # The identity transform filters nothing; its writer drops its pieces of rows (a
    # fault: a loss no real failure makes). The run must not publish the records as
    # "filtered": the writers' received rows are held to what they staged.
    transform = f"{TRANSFORMS}:identity"
    topic, name, config = transform_pipeline(tmp_path, transform)

    r = run_cli("run", "--config", config, env={"PIPELINE_FAULT": "writer_piece:skip"})

    assert r.returncode == 1, r.stderr[-3000:]
    errors = [line for line in r.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and f"lost 10 of the 10 rows of {topic}[0]" in errors[0], \
        r.stderr[-3000:]
    assert result_keys(name) == [] and stored_offsets(name) == {}
    assert query("SELECT count(*) FROM pipeline_ranges WHERE pipeline = %s", (name,)) == [(0,)]


def test_two_rows_per_record_over_rows_already_there_are_refused_not_dropped(spark, tmp_path):
    # Rows already in the planned range: the run's rows are merged (ON CONFLICT DO NOTHING),
    # where a second row for an offset used to vanish without a word.
    topic, name, config = transform_pipeline(tmp_path, f"{TRANSFORMS}:identity", records=5)
    assert cli_here("run", "--config", config).returncode == 0
    produce_orders(topic, range(5, 10))
    assert cli_here("offsets", "set", "--config", config, "--topic", topic, "--to", "earliest",
                   "--yes").returncode == 0
    transform = f"{TRANSFORMS}:every_order_twice"
    text = open(config).read().replace(f"{TRANSFORMS}:identity", transform)
    open(config, "w").write(text)

    r = cli_here("run", "--config", config)

    assert_refused_naming(r, transform, topic, 0, name)
    assert result_keys(name) == [(topic, 0, o) for o in range(5)]
    assert stored_offsets(name) == {(topic, 0): 0}


SMALL_BLOB = 16 << 10


@pytest.mark.parametrize("fmt, transform", [
    ("json", None), ("raw", None), ("json", f"{TRANSFORMS}:identity"),
], ids=["json", "raw", "json-transform"])
def test_staged_blobs_are_bounded_by_bytes_on_both_paths(spark, monkeypatch, fmt, transform):
    """Records of ~1 KB, staged with a 16 KB cap instead of 64 MB (a cap by record count
    alone let 10,000 records of 100 KB pass Postgres's 1 GB bytea limit): every blob the
    publisher streams, rows and dead letters, is within the cap, the rows' bytes span many
    blobs, and the table is exact. Seen failing with the cap's cut removed from
    stage.range_stager / blob_writer (one blob of ~600 KB)."""
    name = unique("blobcap")
    topic = create_topic(name, 2)
    good = [(str(i).encode(), json.dumps({"order_id": i, "customer": f"c{i}-" + "x" * 1000,
                                          "amount": 1.5}).encode()) for i in range(600)]
    bad = [(b"bad", b'{"order_id": ' + b"y" * 1000)] * 60  # dead letters of ~1 KB (json)
    produce(topic, good + bad)
    settings = init_db(make_settings(name, [topic], fmt=fmt,
                                     sink={"transform": transform} if transform else None))
    # The driver builds each task's StagingTarget (driver/job.py): its cap travels to the
    # executors in the pickled spec.
    monkeypatch.setattr(task, "StagingTarget",
                        functools.partial(task.StagingTarget, max_blob_bytes=SMALL_BLOB))
    streamed: list[tuple[str, int]] = []
    blobs = Publisher._blobs

    def spied(self, kind, parts, topics=None):
        for blob in blobs(self, kind, parts, topics):
            streamed.append((kind, len(blob)))
            yield blob

    monkeypatch.setattr(Publisher, "_blobs", spied)

    result = run_ingest(settings)

    rows = 660 if fmt == "raw" else 600
    assert (result.status, result.rows_written) == ("succeeded", rows), result
    assert query(f"SELECT count(*) FROM {name}") == [(rows,)]
    assert sum(stored_offsets(name).values()) == 660  # every record placed, offsets at the end
    assert max(n for _, n in streamed) <= SMALL_BLOB, sorted(streamed)[-3:]
    row_blobs = [n for kind, n in streamed if kind == ROW]
    assert sum(row_blobs) > rows * 1000 and len(row_blobs) >= rows * 1000 // SMALL_BLOB
    if fmt == "json":
        assert len([n for kind, n in streamed if kind == DEAD]) >= 60 * 1000 // SMALL_BLOB


def test_a_transform_that_reads_its_input_twice_counts_each_record_once(spark):
    """Each read task runs once per use of the input (here twice: a union of two filters)
    and stages its dead letters and range summary each time; one of them is published per
    task. Seen failing with the publisher taking every committed read: 2x the dead letters
    and the ledger's records."""
    name = unique("twice")
    topic = create_topic(name, 2)
    produce(topic, [(b"k", json.dumps({"order_id": i, "customer": "c", "amount": 1}).encode())
                    for i in range(40)] + [(b"k", b"{bad")] * 3)
    settings = init_db(make_settings(name, [topic],
                                     sink={"transform": f"{TRANSFORMS}:evens_then_odds"}))

    result = run_ingest(settings)

    assert (result.status, result.records_read, result.rows_written, result.dead_letters) == (
        "succeeded", 43, 40, 3), result
    assert query(f"SELECT count(DISTINCT \"offset\"), count(*) FROM {name}") == [(40, 40)]
    assert query('SELECT sum(records), sum(rows_written), sum(dead_letters), sum(filtered) '
                 "FROM pipeline_ranges WHERE pipeline = %s", (name,)) == [(43, 40, 3, 0)]


def test_a_transform_that_limits_its_input_is_exit_2_before_anything_is_read(spark):
    """A limit() over the input is found in the transform's plan (spark/transform.py)."""
    name = unique("limit")
    topic = create_topic(name, 1)
    produce_orders(topic, range(20))
    settings = init_db(make_settings(name, [topic],
                                     sink={"transform": f"{TRANSFORMS}:first_ten"}))

    with pytest.raises(ConfigError, match=rf"\[sink\] transform '{TRANSFORMS}:first_ten' reads "
                                          r"only part of its input \(a limit\(\) of it\)"):
        run_ingest(settings)

    assert query(f"SELECT count(*) FROM {name}") == [(0,)] and stored_offsets(name) == {}


@pytest.mark.slow
def test_a_read_stopped_before_its_end_is_exit_2_nothing_committed(spark, monkeypatch):
    """Without the plan's check, the limit stops the read tasks (the publisher's check):
    they never commit their summaries (dead letters, records read, the ledger's hash), and
    the run is refused naming the transform, nothing committed. 50,000 records of 1 KB in
    one partition: five Arrow batches of 10 MB, more than the socket between a Python
    worker and its JVM holds once the limit stops reading. Seen failing (the run
    committed 10 rows and no ledger) without the publisher's check."""
    from pipeline.spark import transform

    monkeypatch.setattr(transform, "refuse_partial_reads", lambda results, sink: None)
    name = unique("limit")
    topic = create_topic(name, 1)
    produce(topic, [(b"k", json.dumps({"order_id": i, "customer": "c" * 1000,
                                       "amount": 1}).encode()) for i in range(50_000)])
    settings = init_db(make_settings(name, [topic],
                                     sink={"transform": f"{TRANSFORMS}:first_ten"}))

    with pytest.raises(ConfigError, match=rf"\[sink\] transform '{TRANSFORMS}:first_ten' did "
                                          "not read all of its input"):
        run_ingest(settings)

    assert query(f"SELECT count(*) FROM {name}") == [(0,)]
    assert stored_offsets(name) == {}
    assert query("SELECT status, exit_code FROM pipeline_runs WHERE pipeline = %s",
                 (name,)) == [("failed", 2)]
