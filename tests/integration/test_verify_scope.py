"""What 'pipeline verify' could not compare is its own verdict (exit 4, never 0), and what it
could compare is compared all the same: a partition retention cut, records compacted away
after they were published, retention deleting while verify reads, rows of partitions no
run published. And verify holds no snapshot between partitions, exact against a run that
publishes meanwhile. Through the CLI on the real stack."""

from __future__ import annotations

import json
import time

import pytest
from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

from pipeline.driver.job import run_ingest
from pipeline.errors import EXIT_DATA, EXIT_INCOMPLETE, EXIT_OK
from tests.helpers import (
    BOOTSTRAP,
    admin,
    create_topic,
    delete_records,
    make_settings,
    order,
    produce,
    query,
    toml_config,
    unique,
    wait_until,
)
from tests.integration._reliability import finish, init_db, kafka_records, start_waiting
from tests.integration._verify import execute, ingested_twice, verify

UPSERT_TOML = 'mode = "upsert"\nkey = ["order_id"]'


@pytest.fixture(scope="module")
def cut(spark, tmp_path_factory):
    """An append pipeline of two partitions (30 records, and 5 + 3 dead letters) whose
    partition 0 lost offsets [0, 5) to retention after they were published."""
    s, topic, config, _, _ = ingested_twice(tmp_path_factory, "vscope")
    delete_records(topic, 0, 5)
    return s, topic, config


def by_partition(report: dict) -> dict[int, dict]:
    return {p["partition"]: p for p in report["partitions"]}


def test_values_compares_what_kafka_holds_when_a_partition_lost_records(cut, capsys):
    s, topic, config = cut
    table = s.sink.table
    where = 'WHERE topic = %s AND "partition" = %s AND "offset" = %s'
    execute(f"UPDATE {table} SET customer = 'changed' {where}", (topic, 1, 2))
    execute(f"UPDATE {table} SET customer = 'changed' {where}", (topic, 0, 12))
    try:
        code, out, err = verify(config, "--values", "--json", capsys=capsys)
        assert code == EXIT_DATA, err
        values = json.loads(out)["values"]
        # Partition 1 and what partition 0 still holds are compared.
        assert values["missing_keys"] == [[topic, "0", "12"], [topic, "1", "2"]]
    finally:
        for p, o in ((1, 2), (0, 12)):
            execute(f"UPDATE {table} SET customer = %s {where}",
                    (json.loads(order(o))["customer"], topic, p, o))
    code, out, err = verify(config, "--values", capsys=capsys)
    assert code == EXIT_INCOMPLETE, err
    assert f"{topic}[0] offsets [0, 5): not compared (deleted by retention)" in out
    assert "not compared" in err and "--skip-lost" in err
    code, out, err = verify(config, "--values", "--skip-lost", "--json", capsys=capsys)
    assert code == EXIT_OK, err
    report = json.loads(out)
    assert report["verdict"] == "match" and report["values"]["verdict"] == "match"
    assert by_partition(report)[0]["not_compared"] == [
        {"from": 0, "until": 5, "why": "deleted by retention"}]


def test_rows_of_a_partition_or_topic_no_run_published_are_named(cut, capsys):
    s, topic, config = cut
    table = s.sink.table
    for t, p in ((topic, 7), ("never_published", 0)):
        execute(f'INSERT INTO {table} (topic, "partition", "offset", order_id, customer, '
                "run_id) VALUES (%s, %s, 3, 1, 'forged', 0)", (t, p))
    try:
        code, out, err = verify(config, "--json", capsys=capsys)
        assert code == EXIT_DATA, err
        parts = {(p["topic"], p["partition"]): p for p in json.loads(out)["partitions"]}
        for tp in ((topic, 7), ("never_published", 0)):
            assert parts[tp]["verdict"] == "mismatch" and parts[tp]["unpublished"] == 1
        assert parts[(topic, 0)]["verdict"] == "incomplete"
        assert f"{table}" in err and f"{topic}[7] offset 3: unpublished" in err
    finally:
        execute(f"DELETE FROM {table} WHERE customer = 'forged'")


def test_an_upsert_partition_cut_by_retention_is_not_compared_and_the_others_are(
        spark, tmp_path, capsys):
    name = unique("vscope_up")
    topic = create_topic(name, 2)
    s = init_db(make_settings(name, [topic], sink={"mode": "upsert", "key": ["order_id"]}))
    # Partition 0: order 0 once (offset 0), orders 1 and 2 twice; partition 1: 10-12 twice.
    produce(topic, [(b"0", order(0))] + [(str(i).encode(), order(i, customer=f"c{i}v{v}"))
                                         for v in range(2) for i in (1, 2)], partition=0)
    produce(topic, [(str(i).encode(), order(i, customer=f"c{i}v{v}"))
                    for v in range(2) for i in (10, 11, 12)], partition=1)
    run_ingest(s)
    delete_records(topic, 0, 1)  # order 0's only record
    config = tmp_path / "up.toml"
    config.write_text(toml_config(name, [topic], db_url=s.database_url, extra_sink=UPSERT_TOML))
    execute(f"UPDATE {name} SET customer = 'changed' WHERE order_id = 11")
    try:
        code, out, err = verify(config, "--json", capsys=capsys)
        assert code == EXIT_DATA, err
        report = json.loads(out)
        assert report["missing_keys"] == [["11"]] and report["verdict"] == "mismatch"
        parts = by_partition(report)
        assert parts[1]["verdict"] == "mismatch"
        assert parts[0]["verdict"] == "incomplete" and parts[0]["not_compared"] == [
            {"from": 0, "until": 1, "why": "deleted by retention"}]
    finally:
        execute(f"UPDATE {name} SET customer = 'c11v1' WHERE order_id = 11")
    code, out, err = verify(config, capsys=capsys)
    assert code == EXIT_INCOMPLETE, err
    assert f"{topic}[0]" in out and "incomplete" in out
    # Order 0's row was made by the record retention took: left out, not "unexpected".
    code, out, err = verify(config, "--skip-lost", "--json", capsys=capsys)
    assert code == EXIT_OK, err
    report = json.loads(out)
    assert (report["rows_not_compared"], report["unexpected"]) == (1, 0)


def compact_now(topic: str) -> None:
    """Lets the log cleaner compact ``topic`` (made with a long min.compaction.lag.ms)."""
    client = admin()
    [f] = client.incremental_alter_configs([ConfigResource("topic", topic, incremental_configs=[
        ConfigEntry("min.compaction.lag.ms", "0",
                    incremental_operation=AlterConfigOpType.SET)])]).values()
    f.result()


def test_records_compacted_away_after_they_were_published_are_not_compared(
        spark, tmp_path, capsys):
    topic = create_topic(unique("vcompacted"), 1, **{
        "cleanup.policy": "compact", "segment.ms": "100", "min.cleanable.dirty.ratio": "0.01",
        "delete.retention.ms": "100", "min.compaction.lag.ms": "3600000"})
    for batch in range(3):  # closed segments (segment.ms), five keys written again and again
        produce(topic, [(f"key-{i % 5}".encode(), order(batch * 10 + i)) for i in range(10)],
                partition=0)
        time.sleep(0.3)
    s = init_db(make_settings(unique("vcompacted"), [topic]))
    assert run_ingest(s).rows_written == 30
    compact_now(topic)
    produce(topic, [(b"roll", order(999))], partition=0)  # closes the last segment
    wait_until(lambda: len([o for _, o in kafka_records(topic, BOOTSTRAP) if o < 30]) < 30,
               "the log cleaner to compact the topic", timeout=90)
    config = tmp_path / "vcompacted.toml"
    config.write_text(toml_config(s.name, [topic], db_url=s.database_url))
    code, out, err = verify(config, "--json", capsys=capsys)
    assert code == EXIT_INCOMPLETE, err
    (part,) = json.loads(out)["partitions"]
    assert part["verdict"] == "incomplete" and part["unexpected"] == 0
    assert part["ledger_mismatches"] == 0 and part["ledger_only"]
    assert verify(config, "--skip-lost", capsys=capsys)[0] == EXIT_OK


def test_retention_deleting_while_verify_reads_is_not_compared_not_a_transient_error(
        spark, tmp_path):
    topic = create_topic(unique("vdeleting"), 1)
    produce(topic, [(b"k", order(i)) for i in range(20)], partition=0)
    s = init_db(make_settings(unique("vdeleting"), [topic]))
    run_ingest(s)
    config = tmp_path / "vdeleting.toml"
    config.write_text(toml_config(s.name, [topic], db_url=s.database_url))
    go = tmp_path / "go"
    proc = start_waiting("verify", "--config", str(config), "--json", point="verify_read", go=go)
    try:
        delete_records(topic, 0, 5)  # after verify asked Kafka where the log starts
    finally:
        go.touch()
    code, out, err = finish(proc)
    assert code == EXIT_INCOMPLETE, err
    (part,) = json.loads(out)["partitions"]
    assert part["not_compared"] == [{"from": 0, "until": 5, "why": "deleted by retention"}]
    assert (part["expected"], part["rows"], part["verdict"]) == (15, 15, "incomplete")


def test_verify_holds_no_snapshot_between_partitions_and_sees_a_run_published_meanwhile(
        spark, tmp_path):
    topic = create_topic(unique("vsnap"), 2)
    for p in (0, 1):
        produce(topic, [(b"k", order(i)) for i in range(3)], partition=p)
    s = init_db(make_settings(unique("vsnap"), [topic]))
    run_ingest(s)
    config = tmp_path / "vsnap.toml"
    config.write_text(toml_config(s.name, [topic], db_url=s.database_url))
    go = tmp_path / "go"
    proc = start_waiting("verify", "--config", str(config), "--json", point="verify_chunk",
                         go=go)
    try:
        in_transaction = query(
            "SELECT pid, state FROM pg_stat_activity WHERE datname = current_database() "
            "AND pid <> pg_backend_pid() AND xact_start IS NOT NULL "
            "AND backend_type = 'client backend'")
        for p in (0, 1):
            produce(topic, [(b"k", order(i)) for i in range(3, 5)], partition=p)
        run_ingest(s)  # publishes while verify waits
    finally:
        go.touch()
    code, out, err = finish(proc)
    assert in_transaction == [], in_transaction
    assert code == EXIT_OK, err
    assert [(p["expected"], p["rows"]) for p in json.loads(out)["partitions"]] == [(5, 5)] * 2
