"""The ledger of published ranges (pipeline_ranges) on the real stack: written with the
run's rows in its publishing transaction (and not at all when that rolls back), and what
'pipeline verify' proves with it: a forged ledger row, a deleted row and a topic recreated
with other records at the same offsets are named by range and run (exit 3); ranges
retention deleted are checked against the ledger only, and said so (not compared)."""

from __future__ import annotations

import json

import pytest

from pipeline.driver.job import run_ingest
from pipeline.driver.verify import Filters, run_verify
from pipeline.errors import EXIT_DATA, EXIT_OK
from pipeline.executor.content_hash import ContentHash
from pipeline.plan.offsets import OffsetRange
from tests.helpers import (
    BOOTSTRAP,
    cli_here,
    create_topic,
    delete_records,
    make_settings,
    order,
    produce,
    query,
    recreate_topic,
    run_cli,
    toml_config,
    unique,
)
from tests.integration._reliability import init_db
from tests.integration._verify import execute, ingested_twice, verify


@pytest.fixture(scope="module")
def pipeline(spark, tmp_path_factory):
    """Two partitions, good records and dead letters (without a key), ingested by two runs."""
    return ingested_twice(tmp_path_factory, "ledger", bad_key=None)


def ledger(pipeline: str) -> list[tuple]:
    return query('SELECT run_id, "partition", from_offset, until_offset, records, '
                 "rows_written, dead_letters, skipped, content_hash FROM pipeline_ranges "
                 "WHERE pipeline = %s ORDER BY 2, 3", (pipeline,))


def kafka_hash(topic: str, partition: int, start: int, until: int) -> bytes:
    from pipeline.executor.consume import read_range, reader_config

    h = ContentHash()
    for batch in read_range(reader_config({"bootstrap.servers": BOOTSTRAP},
                                          "read_committed", unique("g")),
                            OffsetRange(topic, partition, start, until), 30):
        h.add(batch)
    return h.digest()


def test_each_published_range_has_a_ledger_row_with_its_counts_and_hash(pipeline):
    s, topic, _, first, second = pipeline
    rows = ledger(s.name)
    assert [r[:8] for r in rows] == [(first, 0, 0, 20, 20, 20, 0, 0),
                                     (second, 0, 20, 30, 10, 10, 0, 0),
                                     (first, 1, 0, 8, 8, 5, 3, 0)]
    for _, p, start, until, *_, digest in rows:
        assert bytes(digest) == kafka_hash(topic, p, start, until)


def test_an_exact_pipeline_verifies_clean_against_the_ledger(pipeline, capsys):
    s, _, config, _, _ = pipeline
    code, out, err = verify(config, "--json", capsys=capsys)
    assert code == EXIT_OK, err
    by_p = {p["partition"]: p for p in json.loads(out)["partitions"]}
    assert (by_p[0]["ledger_ranges"], by_p[0]["ledger_hashed"]) == (2, 2)
    assert (by_p[1]["ledger_ranges"], by_p[1]["ledger_hashed"]) == (1, 1)
    assert not by_p[0]["ledger_only"] and by_p[0]["ledger_mismatches"] == 0
    code, out, _ = verify(config, capsys=capsys)
    assert code == EXIT_OK and "2/2 hashed" in out


@pytest.mark.parametrize("forged, kind", [
    ("content_hash = '\\x00000000000000000000000000000000'", "changed"),
    ("records = records + 1", "changed"),
    ("rows_written = rows_written - 1", "ledger")])
def test_a_forged_ledger_row_is_named_with_its_range_and_run(pipeline, capsys, forged,
                                                             kind):
    s, topic, config, first, _ = pipeline
    where = ("WHERE pipeline = %s AND run_id = %s AND \"partition\" = 0")
    (saved,) = query(f"SELECT records, rows_written, content_hash FROM pipeline_ranges {where}",
                     (s.name, first))
    execute(f"UPDATE pipeline_ranges SET {forged} {where}", (s.name, first))
    try:
        code, out, err = verify(config, capsys=capsys)
        assert code == EXIT_DATA
        assert f"{topic}[0] offsets [0, 20) of run {first}: {kind}" in out
        assert f"{topic}[0] offsets [0, 20) of run {first}: {kind}" in err
        (p0, _) = run_verify(s, Filters(topic=topic)).partitions
        assert p0.ledger_mismatches == 1 and (p0.missing, p0.unexpected) == (0, 0)
    finally:
        execute(f"UPDATE pipeline_ranges SET records = %s, rows_written = %s, "
                f"content_hash = %s {where}", (*saved, s.name, first))
    assert verify(config, capsys=capsys)[0] == EXIT_OK


def test_a_deleted_row_is_named_by_the_ledger_with_its_range(pipeline, capsys):
    s, topic, config, _, second = pipeline
    table = s.sink.table
    key = 'WHERE topic = %s AND "partition" = 0 AND "offset" = 25'
    (saved,) = query(f"SELECT * FROM {table} {key}", (topic,))
    execute(f"DELETE FROM {table} {key}", (topic,))
    try:
        code, out, _ = verify(config, capsys=capsys)
        assert code == EXIT_DATA
        assert f"{topic}[0] offset 25: missing" in out
        assert (f"{topic}[0] offsets [20, 30) of run {second}: ledger (the tables hold 9 "
                "rows + 0 dead letters here, the run published 10 + 0)") in out
    finally:
        execute(f"INSERT INTO {table} VALUES ({', '.join(['%s'] * len(saved))})", saved)
    assert verify(config, capsys=capsys)[0] == EXIT_OK


def test_a_topic_recreated_with_other_records_at_the_same_offsets_is_named(spark, capsys):
    topic = create_topic(unique("lrecreate"), 1)
    produce(topic, [(b"k", order(i)) for i in range(10)], partition=0)
    s = init_db(make_settings(unique("lrecreate"), [topic]))
    run_id = run_ingest(s).run_id
    assert run_verify(s, Filters()).ok
    recreate_topic(topic, 1)
    produce(topic, [(b"k", order(i)) for i in [0, 1, 2, 3, 4, 5, 6, 7, 8, 99]], partition=0)

    (part,) = run_verify(s, Filters()).partitions
    # Every offset still has its record: only the content hash tells the topics apart.
    assert (part.expected, part.missing, part.unexpected) == (10, 0, 0)
    assert not part.ok and part.ledger_mismatches == 1
    (m,) = [m for m in part.mismatches if m["kind"] == "changed"]
    assert (m["topic"], m["partition"], m["offset"], m["until"], m["run_id"]) == (
        topic, 0, 0, 10, run_id)
    assert "content differs" in m["what"]


def test_ranges_retention_deleted_are_checked_against_the_ledger_only(spark, capsys):
    topic = create_topic(unique("lretention"), 1)
    produce(topic, [(b"k", order(i)) for i in range(10)], partition=0)
    s = init_db(make_settings(unique("lretention"), [topic]))
    first = run_ingest(s).run_id
    produce(topic, [(b"k", order(i)) for i in range(10, 20)], partition=0)
    run_ingest(s)
    delete_records(topic, 0, 5)

    (part,) = run_verify(s, Filters()).partitions
    # Not compared, so not a match: exit 4 (test_verify_scope.py), unless left out of scope.
    assert part.verdict == "incomplete" and run_verify(s, Filters(), skip_lost=True).ok
    assert (part.ledger_ranges, part.ledger_hashed) == (2, 1)
    assert part.skipped == {"retention_deleted": 5}
    assert [(n["from"], n["until"], n["run_id"]) for n in part.ledger_only] == [
        (0, 10, first)]
    assert "deleted by retention: checked against the ledger only" in part.ledger_only[0]["why"]
    # The ledger still holds the deleted range to account: a row gone from it is named.
    execute(f'DELETE FROM {s.sink.table} WHERE topic = %s AND "offset" = 2', (topic,))
    (part,) = run_verify(s, Filters()).partitions
    assert not part.ok and part.ledger_mismatches == 1
    assert [(m["offset"], m["until"], m["kind"]) for m in part.mismatches] == [
        (0, 10, "ledger")]


def test_a_run_rolled_back_before_commit_leaves_no_ledger_row(spark, tmp_path):
    topic = create_topic(unique("lrollback"), 1)
    produce(topic, [(b"k", order(i)) for i in range(10)], partition=0)
    s = init_db(make_settings(unique("lrollback"), [topic]))
    config = tmp_path / "rollback.toml"
    config.write_text(toml_config(s.name, [topic], db_url=s.database_url))

    failed = run_cli("run", "--config", str(config),
                     env={"PIPELINE_FAULT": "before_commit:raise"})
    assert failed.returncode != 0 and ledger(s.name) == []
    assert cli_here("run", "--config", str(config)).returncode == 0
    assert [r[1:8] for r in ledger(s.name)] == [(0, 0, 10, 10, 10, 0, 0)]


def test_the_ledger_hashed_on_spark_executors_gives_the_same_verdicts(pipeline,
                                                                      monkeypatch):
    from pipeline.driver import verify, verify_spark

    s, topic, _, first, _ = pipeline
    on_driver = run_verify(s, Filters(), spark="never")

    def no_driver_read(*args):
        raise AssertionError("the driver re-read a ledger range itself")

    # Reconcile still reads offsets on the driver (records()); the ledger must not.
    monkeypatch.setattr(verify, "batches", no_driver_read)
    monkeypatch.setattr(verify, "records", lambda reader, r, timeout: iter(
        o for batch in _read(reader, r, timeout) for o in (m.offset() for m in batch)))
    monkeypatch.setattr(verify_spark, "SPAN_OFFSETS", 7)  # partition 0: two tasks
    on_spark = run_verify(s, Filters(), spark="always")
    assert on_spark.ok and on_spark.as_dict() == on_driver.as_dict()
    assert sum(p.ledger_hashed for p in on_spark.partitions) == 3

    where = 'WHERE pipeline = %s AND run_id = %s AND "partition" = 0'
    execute(f"UPDATE pipeline_ranges SET records = records + 1 {where}", (s.name, first))
    try:
        (p0, _) = run_verify(s, Filters(topic=topic), spark="always").partitions
        assert p0.ledger_mismatches == 1
        assert [(m["offset"], m["until"], m["run_id"], m["kind"]) for m in p0.mismatches] == [
            (0, 20, first, "changed")]
    finally:
        execute(f"UPDATE pipeline_ranges SET records = records - 1 {where}", (s.name, first))


def _read(reader, r, timeout):
    from pipeline.executor.consume import read_range

    return read_range(reader, r, timeout)
