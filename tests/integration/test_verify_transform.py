"""``pipeline verify`` of a pipeline with a [sink] transform (issue 28): its runs write ledger
rows in the publishing transaction (records read, the transform's filtered ones included,
rows, dead letters, and the built-in sinks' content hash, computed by the read tasks that
feed the transform), and verify checks them against Kafka and the tables: a clean pipeline
exits 0 with the filtered records counted, a deleted row or a forged ledger row is named by
range and run (exit 3). The table's values cannot be recomputed without running the transform."""

from __future__ import annotations

import json

import pytest

from pipeline.cli import main as cli_main
from pipeline.driver.job import run_ingest
from pipeline.driver.verify import Filters, run_verify
from pipeline.errors import EXIT_DATA, EXIT_OK
from pipeline.executor.content_hash import ContentHash
from pipeline.plan.offsets import OffsetRange
from tests.helpers import (
    BOOTSTRAP,
    create_topic,
    make_settings,
    order,
    produce,
    query,
    toml_config,
    unique,
)
from tests.integration._reliability import init_db
from tests.integration.test_verify import execute

SKIP_THIRDS = "tests.integration.transforms.orders:skip_every_third_order"


@pytest.fixture(scope="module")
def pipeline(spark, tmp_path_factory):
    """Two partitions, two runs; the transform filters orders whose id is a multiple of 3;
    a null key, a null value (a dead letter) and unparsable values (dead letters)."""
    topic = create_topic(unique("vtrans"), 2)
    produce(topic, [(b"k", order(i)) for i in range(12)] + [(None, order(13))], partition=0)
    produce(topic, [(b"k", order(i)) for i in range(4)] + [(b"k", None), (b"", b"{bad")],
            partition=1)
    s = init_db(make_settings(unique("vtrans"), [topic], sink={"transform": SKIP_THIRDS}))
    first = run_ingest(s).run_id
    produce(topic, [(b"k", order(i)) for i in range(20, 26)], partition=0)
    second = run_ingest(s).run_id
    config = tmp_path_factory.mktemp("vtrans") / "vtrans.toml"
    config.write_text(toml_config(s.name, [topic], db_url=s.database_url,
                                  extra_sink=f'transform = "{SKIP_THIRDS}"'))
    return s, topic, config, first, second


def ledger(pipeline: str) -> list[tuple]:
    return query('SELECT run_id, "partition", from_offset, until_offset, records, '
                 "rows_written, dead_letters, filtered, skipped, hash_kind, content_hash "
                 "FROM pipeline_ranges WHERE pipeline = %s ORDER BY 2, 3", (pipeline,))


def kafka_sum(topic: str, partition: int, start: int, until: int) -> bytes:
    from pipeline.executor.consume import read_range, reader_config

    h = ContentHash()
    for batch in read_range(reader_config({"bootstrap.servers": BOOTSTRAP},
                                          "read_committed", unique("g")),
                            OffsetRange(topic, partition, start, until), 30):
        h.add(batch)
    return h.digest()


def verify(config, *args: str, capsys) -> tuple[int, str, str]:
    code = cli_main(["verify", "--config", str(config), *args])
    out, err = capsys.readouterr()
    return code, out, err


def test_a_transform_run_writes_ledger_rows_with_filtered_records_and_the_kafka_hash(
        pipeline):
    s, topic, _, first, second = pipeline
    rows = ledger(s.name)
    # Partition 0, run 1: orders 0-11 and 13; 0, 3, 6, 9 filtered. Run 2: 20-25; 21, 24.
    # Partition 1: orders 0-3 (0 and 3 filtered), a null value and "{bad": dead letters.
    assert [r[:10] for r in rows] == [
        (first, 0, 0, 13, 13, 9, 0, 4, 0, "blake2b"),
        (second, 0, 13, 19, 6, 4, 0, 2, 0, "blake2b"),
        (first, 1, 0, 6, 6, 2, 2, 2, 0, "blake2b")]
    # The hash the read tasks computed is the one verify computes from Kafka (a null key, a null
    # value and an empty key framed alike on both sides).
    for _, p, start, until, *_, digest in rows:
        assert bytes(digest) == kafka_sum(topic, p, start, until)


def test_a_shuffling_transform_over_a_split_range_counts_each_row_in_its_ledger_row(
        spark, tmp_path, capsys):
    # 120,000 records of one partition: the read is split into tasks of ~40,000 offsets,
    # each range its own ledger row; the shuffle mixes their rows in every writer's batch.
    topic = create_topic(unique("vsplit"), 1)
    for start in range(0, 120_000, 60_000):  # the producer's queue holds 100,000
        produce(topic, [(None, order(i)) for i in range(start, start + 60_000)], partition=0)
    shuffle = "tests.integration.transforms.orders:shuffled"
    s = init_db(make_settings(unique("vsplit"), [topic], sink={"transform": shuffle}))
    assert run_ingest(s).rows_written == 120_000
    rows = ledger(s.name)
    assert len(rows) > 1
    # (records, rows_written, dead_letters, filtered) per range: every record is a row.
    assert [r[4:8] for r in rows] == [(r[4], r[4], 0, 0) for r in rows]
    assert sum(r[4] for r in rows) == 120_000
    config = tmp_path / "vsplit.toml"
    config.write_text(toml_config(s.name, [topic], db_url=s.database_url,
                                  extra_sink=f'transform = "{shuffle}"'))
    code, out, err = verify(config, capsys=capsys)
    assert code == EXIT_OK, out + err


def test_a_transform_pipeline_verifies_clean_with_its_filtered_records_counted(pipeline,
                                                                                capsys):
    s, topic, config, _, _ = pipeline
    code, out, err = verify(config, "--json", capsys=capsys)
    assert code == EXIT_OK, err
    by_p = {p["partition"]: p for p in json.loads(out)["partitions"]}
    assert (by_p[0]["filtered"], by_p[0]["missing"], by_p[0]["ledger_hashed"]) == (6, 0, 2)
    assert (by_p[1]["filtered"], by_p[1]["rows"], by_p[1]["dead_letters"]) == (2, 2, 2)
    code, out, _ = verify(config, capsys=capsys)
    assert code == EXIT_OK and f"{topic}[0]: 6 record(s) in neither table, filtered" in out


def test_a_deleted_row_of_a_transform_pipeline_is_named_by_the_ledger(pipeline, capsys):
    s, topic, config, _, second = pipeline
    key = 'WHERE topic = %s AND "partition" = 0 AND "offset" = 15'
    (saved,) = query(f"SELECT * FROM {s.sink.table} {key}", (topic,))
    execute(f"DELETE FROM {s.sink.table} {key}", (topic,))
    try:
        code, out, _ = verify(config, capsys=capsys)
        assert code == EXIT_DATA
        assert (f"{topic}[0] offsets [13, 19) of run {second}: ledger (the tables hold 3 "
                "rows + 0 dead letters here, the run published 4 + 0)") in out
    finally:
        execute(f"INSERT INTO {s.sink.table} VALUES ({', '.join(['%s'] * len(saved))})",
                saved)
    assert verify(config, capsys=capsys)[0] == EXIT_OK


@pytest.mark.parametrize("forged", ["content_hash = '\\x00000000000000000000000000000001'",
                                    "records = records - 1"])
def test_a_forged_transform_ledger_row_is_named_as_changed(pipeline, capsys, forged):
    s, topic, config, first, _ = pipeline
    where = 'WHERE pipeline = %s AND run_id = %s AND "partition" = 1'
    (saved,) = query(f"SELECT records, content_hash FROM pipeline_ranges {where}",
                     (s.name, first))
    execute(f"UPDATE pipeline_ranges SET {forged} {where}", (s.name, first))
    try:
        code, out, _ = verify(config, capsys=capsys)
        assert code == EXIT_DATA
        assert f"{topic}[1] offsets [0, 6) of run {first}: changed" in out
        (_, p1) = run_verify(s, Filters(topic=topic)).partitions
        assert p1.ledger_mismatches == 1 and p1.missing == 0
    finally:
        execute(f"UPDATE pipeline_ranges SET records = %s, content_hash = %s {where}",
                (*saved, s.name, first))


def test_verify_values_is_refused_for_a_transform_naming_why(pipeline, capsys):
    _, _, config, _, _ = pipeline
    code, _, err = verify(config, "--values", capsys=capsys)
    assert code == 2 and "without running it" in err
