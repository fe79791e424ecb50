"""pipeline verify on the real stack: an exact pipeline verifies clean, a deleted row and a
forged row are named with their coordinates (exit 3), and a transactional topic's aborted
records and markers are skipped offsets, not mismatches. In-process on the shared
SparkSession; the command through pipeline.cli.main."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from confluent_kafka import Producer

from pipeline.driver.job import run_ingest
from pipeline.driver.verify import Filters, run_verify
from pipeline.errors import EXIT_DATA, EXIT_OK
from tests.helpers import (
    BOOTSTRAP,
    create_topic,
    make_settings,
    order,
    query,
    toml_config,
    unique,
)
from tests.integration._reliability import init_db
from tests.integration._verify import execute, ingested_twice, verify
from tests.integration.test_bad_input import compacted_topic  # noqa: F401 (fixture)


@pytest.fixture(scope="module")
def pipeline(spark, tmp_path_factory):
    """Two partitions, good records and dead letters, ingested by two runs."""
    return ingested_twice(tmp_path_factory, "verify")[:3]


def test_an_exact_pipeline_verifies_clean(pipeline, capsys):
    s, topic, config = pipeline
    code, out, err = verify(config, "--json", capsys=capsys)
    assert code == EXIT_OK, err
    report = json.loads(out)
    assert report["ok"]
    by_p = {p["partition"]: p for p in report["partitions"]}
    assert (by_p[0]["expected"], by_p[0]["rows"], by_p[0]["dead_letters"]) == (30, 30, 0)
    assert (by_p[1]["expected"], by_p[1]["rows"], by_p[1]["dead_letters"]) == (8, 5, 3)
    code, out, _ = verify(config, "--topic", topic, "--partition", "0", "--from", "5",
                          "--to", "12", capsys=capsys)
    assert code == EXIT_OK and "verified: the tables match Kafka on 1 partition" in out


def test_a_deleted_row_and_a_forged_row_are_named_and_exit_3(pipeline, capsys):
    s, topic, config = pipeline
    table = s.sink.table
    saved = query(f'SELECT * FROM {table} WHERE topic = %s AND "partition" = 0 '
                  'AND "offset" = 7', (topic,))
    execute(f'DELETE FROM {table} WHERE topic = %s AND "partition" = 0 AND "offset" = 7',
          (topic,))
    # Rows at offsets Kafka does not have and no run published (partition 0 holds
    # offsets 0-29, partition 1 offsets 0-7).
    for p, o in ((0, 1000), (1, 8)):
        execute(f'INSERT INTO {table} (topic, "partition", "offset", order_id, customer, '
                "run_id) VALUES (%s, %s, %s, 1, 'forged', 0)", (topic, p, o))
    try:
        code, out, err = verify(config, capsys=capsys)
        assert code == EXIT_DATA
        assert f"{topic}[0] offset 7: missing" in out
        assert f"{topic}[0] offset 7: missing" in err  # the one error line names it too
        assert f"{topic}[0] offset 1000: unpublished" in out
        assert "MISMATCH: 2 of 2 partition(s) do not match Kafka" in out
        report = run_verify(s, Filters(topic=topic))
        by_p = {p.partition: p for p in report.partitions}
        assert (by_p[0].missing, by_p[0].unpublished, by_p[0].unexpected) == (1, 1, 0)
        assert by_p[1].unpublished == 1 and by_p[1].mismatches[0]["offset"] == 8
        # Windows of 7 offsets, each in a snapshot of its own (ledger rows crossing them):
        # the same findings.
        assert findings(run_verify(s, Filters(topic=topic), window_offsets=7)) == findings(
            report)
    finally:
        execute(f'DELETE FROM {table} WHERE topic = %s AND customer = %s', (topic, "forged"))
        with_cols = ", ".join('"' + c + '"' for c in (
            r[0] for r in query("SELECT column_name FROM information_schema.columns WHERE "
                                "table_name = %s ORDER BY ordinal_position", (table,))))
        execute(f"INSERT INTO {table} ({with_cols}) VALUES "
              f"({', '.join(['%s'] * len(saved[0]))})", saved[0])
    assert verify(config, capsys=capsys)[0] == EXIT_OK


def findings(report) -> list[dict]:
    return [{**p.as_dict(), "mismatches": sorted(p.mismatches, key=lambda m: (
        m["offset"], m["kind"]))} for p in report.partitions]


def test_values_compares_every_row_with_its_record_and_names_a_changed_one(pipeline,
                                                                           capsys):
    s, topic, config = pipeline
    code, out, err = verify(config, "--values", capsys=capsys)
    assert code == EXIT_OK, err
    assert "values: 35 row(s) compared with 35 made from their records: match" in out
    table = s.sink.table
    execute(f"UPDATE {table} SET customer = 'changed' WHERE topic = %s AND \"partition\" = 0 "
            'AND "offset" = 12', (topic,))
    try:
        # The offsets and the counts still match: only --values sees it.
        assert verify(config, capsys=capsys)[0] == EXIT_OK
        code, out, err = verify(config, "--values", capsys=capsys)
        assert code == EXIT_DATA
        assert f"row at ({topic}, 0, 12): differs from its record" in out
        assert "1 row(s) of" in err and f"({topic}, 0, 12)" in err
        code, out, _ = verify(config, "--values", "--json", "--partition", "1", capsys=capsys)
        assert code == EXIT_OK, out  # the window leaves partition 0 out
        assert json.loads(out)["values"]["state_rows"] == 5
    finally:
        execute(f"UPDATE {table} SET customer = %s WHERE topic = %s AND \"partition\" = 0 "
                'AND "offset" = 12', (json.loads(order(12))["customer"], topic))
    assert verify(config, "--values", capsys=capsys)[0] == EXIT_OK


def test_aborted_records_and_markers_verify_clean_and_a_row_claiming_one_is_unexpected(
        spark, capsys):
    topic = create_topic(unique("vtxn"), 1)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "transactional.id": unique("txid")})
    p.init_transactions(30)
    for ids, commit in ((range(0, 5), True), (range(100, 105), False), (range(5, 10), True)):
        p.begin_transaction()
        for i in ids:
            p.produce(topic, key=b"k", value=order(i), partition=0)
        p.flush(30)
        (p.commit_transaction if commit else p.abort_transaction)(30)
    s = init_db(make_settings(unique("vtxn"), [topic]))
    assert run_ingest(s).rows_written == 10
    report = run_verify(s, Filters())
    (part,) = report.partitions
    assert report.ok and part.expected == part.rows == 10
    # Skipped, and why: 5 aborted records, 3 markers (one per transaction).
    assert part.skipped == {"aborted": 5, "transaction_marker": 3}
    # Offsets 5-9 are the aborted records, 10 the abort marker: a row claiming one is
    # not a record in Kafka.
    execute(f"INSERT INTO {s.sink.table} (topic, \"partition\", \"offset\", order_id, customer, "
          "run_id) VALUES (%s, 0, 7, 1, 'forged', 0)", (topic,))
    report = run_verify(replace(s), Filters())
    (part,) = report.partitions
    assert not report.ok and part.unexpected == 1
    assert part.mismatches[0]["offset"] == 7 and part.mismatches[0]["kind"] == "unexpected"


def test_compacted_offsets_are_reported_as_skipped_and_why(
        spark, compacted_topic, capsys, tmp_path):  # noqa: F811 (the fixture)
    topic, end, _ = compacted_topic
    s = init_db(make_settings(unique("vcompact"), [topic]))
    read = run_ingest(s).records_read  # the cleaner may have compacted more since
    assert 0 < read < end
    (part,) = run_verify(s, Filters()).partitions
    assert part.ok and part.expected == read
    assert part.skipped == {"compacted_or_marker": end - read}
    config = tmp_path / "vcompact.toml"
    config.write_text(toml_config(s.name, [topic], db_url=s.database_url))
    code, out, _ = verify(config, capsys=capsys)
    assert code == EXIT_OK and (f"{topic}[0]: {end - read} offset(s) skipped, no record to "
                                f"verify: {end - read} compacted away or transaction "
                                "markers") in out


def test_a_dropped_dead_letter_is_named_missing_and_exit_3(pipeline, capsys):
    # A record is in neither table once its dead letter is gone: verify names it.
    s, topic, config = pipeline
    where = 'WHERE pipeline = %s AND topic = %s AND "partition" = 1 AND "offset" = 6'
    [saved] = query(f"SELECT * FROM pipeline_dead_letters {where}", (s.name, topic))
    execute(f"DELETE FROM pipeline_dead_letters {where}", (s.name, topic))
    try:
        code, out, _ = verify(config, capsys=capsys)
        assert code == EXIT_DATA
        assert f"{topic}[1] offset 6: missing" in out
    finally:
        execute(f"INSERT INTO pipeline_dead_letters VALUES ({', '.join(['%s'] * len(saved))})",
                [json.dumps(v) if isinstance(v, (dict, list)) else v for v in saved])
    assert verify(config, capsys=capsys)[0] == EXIT_OK


def test_a_forged_offset_row_is_named_and_exit_3(pipeline, capsys):
    # Stored offsets moved past what any run published (records skipped by hand, or a
    # forged row): the offsets between are named, not taken as verified.
    s, topic, config = pipeline
    where = 'WHERE pipeline = %s AND topic = %s AND "partition" = 0'
    execute(f"UPDATE pipeline_offsets SET next_offset = next_offset + 5 {where}",
            (s.name, topic))
    try:
        code, out, _ = verify(config, capsys=capsys)
        assert code == EXIT_DATA, out
        assert (f"{topic}[0] offset 35: stored_offset" in out
                and "set it to 30 (its planned range's end)" in out), out
    finally:
        execute(f"UPDATE pipeline_offsets SET next_offset = next_offset - 5 {where}",
                (s.name, topic))
    assert verify(config, capsys=capsys)[0] == EXIT_OK
