"""pipeline verify of upsert and aggregate sinks on the real stack: the state recomputed
from every published record (newest per key, tombstones deleting; totals per group) is
compared with the table. Exact -> exit 0; a changed value or a deleted key -> named, exit
3; records deleted by retention -> the rows they made not compared, the rest compared,
exit 4 (an aggregate's totals: nothing compared)."""

from __future__ import annotations

import argparse
import json

import pytest

from pipeline.commands.verify import cmd_verify
from pipeline.driver.job import run_ingest
from pipeline.driver.verify_state import run_state_verify
from pipeline.errors import EXIT_CONFIG, EXIT_DATA, EXIT_INCOMPLETE, EXIT_OK, PipelineError
from tests.helpers import create_topic, delete_records, make_settings, produce, query, unique
from tests.integration._reliability import init_db
from tests.integration._sink_modes import AGGREGATE, event, tombstone, upsert_settings
from tests.integration._verify import execute


def verify(settings, capsys, **filters) -> tuple[int | str, dict]:
    """The command's handler on these settings, --json: (exit code, or the error's
    message; the report)."""
    args = argparse.Namespace(**{"topic": None, "partition": None, "from_offset": None,
                                 "to_offset": None, "json": True, "values": False,
                                 "skip_lost": False, **filters})
    try:
        code: int | str = cmd_verify(args, settings)
    except PipelineError as e:
        code = f"{e.exit_code}: {e.message}"
    out = capsys.readouterr().out
    return code, json.loads(out) if out else {}


@pytest.fixture(scope="module")
def upsert(spark):
    """Orders in two partitions, each updated several times, two deleted, over two runs."""
    topic = create_topic(unique("vstate"), 2)
    s = upsert_settings(unique("vstate"), topic, tombstones="delete")
    for p in (0, 1):
        produce(topic, [event(i, v) for v in range(3) for i in range(p * 10, p * 10 + 10)],
                partition=p)
    run_ingest(s)
    produce(topic, [event(3, 7), tombstone(4)], partition=0)
    produce(topic, [event(12, 9), tombstone(15)], partition=1)
    run_ingest(s)
    return s, topic


def test_an_exact_upsert_table_verifies_clean(upsert, capsys):
    s, _ = upsert
    report = run_state_verify(s)
    assert report.ok and report.compared
    assert (report.records, report.state_rows, report.table_rows) == (64, 18, 18)
    args = argparse.Namespace(topic=None, partition=None, from_offset=None, to_offset=None,
                              json=False, values=False, skip_lost=False)
    assert cmd_verify(args, s) == EXIT_OK
    assert (f"verified: {s.sink.table} holds exactly the state of 64 records (18 keys)"
            in capsys.readouterr().out)


def test_a_changed_value_and_a_deleted_key_are_named_with_exit_3(upsert, capsys):
    s, _ = upsert
    table = s.sink.table
    assert verify(s, capsys)[0] == EXIT_OK
    (saved,) = query(f"SELECT status FROM {table} WHERE order_id = 3")
    (row,) = query(f"SELECT * FROM {table} WHERE order_id = 17")
    execute(f"UPDATE {table} SET status = 'forged' WHERE order_id = 3")
    execute(f"DELETE FROM {table} WHERE order_id = 17")
    try:
        code, report = verify(s, capsys)
        assert str(code).startswith(f"{EXIT_DATA}: ") and "first: (3); (17)" in str(code)
        assert (report["missing"], report["unexpected"]) == (2, 1)
        assert report["missing_keys"] == [["3"], ["17"]] and report["unexpected_keys"] == [["3"]]
    finally:
        execute(f"UPDATE {table} SET status = %s WHERE order_id = 3", saved)
        execute(f"INSERT INTO {table} VALUES ({', '.join(['%s'] * len(row))})", row)
    assert verify(s, capsys)[0] == EXIT_OK


def test_a_deleted_key_brought_back_is_unexpected(upsert):
    s, _ = upsert
    execute(f"INSERT INTO {s.sink.table} (order_id, customer, topic, \"partition\", "
            "\"offset\", run_id) VALUES (4, 'ghost', 'x', 0, 0, 0)")
    try:
        report = run_state_verify(s)
        assert (report.missing, report.unexpected, report.unexpected_keys) == (0, 1, [["4"]])
    finally:
        execute(f"DELETE FROM {s.sink.table} WHERE order_id = 4")


def test_aggregate_totals_are_recomputed_and_a_changed_total_is_named(spark, capsys):
    topic = create_topic(unique("vagg"), 2)
    s = init_db(make_settings(unique("vagg"), [topic], sink=AGGREGATE))
    produce(topic, [event(i, 1) for i in range(30)], partition=0)
    run_ingest(s)
    produce(topic, [event(i, 2) for i in range(30, 50)], partition=1)
    run_ingest(s)
    code, report = verify(s, capsys)
    assert code == EXIT_OK and (report["records"], report["state_rows"]) == (50, 7)
    execute(f"UPDATE {s.sink.table} SET total = total + 1 WHERE customer = 'c3'")
    code, report = verify(s, capsys)
    assert str(code).startswith(f"{EXIT_DATA}: ")
    assert report["missing_keys"] == report["unexpected_keys"] == [["c3"]]
    code, _ = verify(s, capsys, partition=0)
    assert str(code).startswith(f"{EXIT_CONFIG}: ") and "apply to append sinks only" in code
    # A total includes every record: one Kafka no longer holds, and nothing is compared,
    # whatever the scope.
    execute(f"UPDATE {s.sink.table} SET total = total - 1 WHERE customer = 'c3'")
    delete_records(topic, 0, 1)
    code, report = verify(s, capsys, skip_lost=True)
    assert str(code).startswith(f"{EXIT_INCOMPLETE}: ") and "nothing compared" in code
    assert report["verdict"] == "incomplete" and report["nothing_compared"]


def test_records_deleted_by_retention_are_not_compared_and_the_rest_is(spark):
    topic = create_topic(unique("vstate_ret"), 1)
    s = upsert_settings(unique("vstate_ret"), topic)
    produce(topic, [event(i, 1) for i in range(10)], partition=0)
    run_ingest(s)
    delete_records(topic, 0, 3)
    report = run_state_verify(s)
    # Orders 0-2's rows were made by the records retention took: left out.
    assert report.verdict == "incomplete" and not report.compared
    assert (report.records, report.table_rows, report.rows_not_compared) == (7, 7, 3)
    assert report.not_compared == [{"topic": topic, "partition": 0, "from": 0, "until": 3,
                                    "why": "deleted by retention"}]
    assert run_state_verify(s, skip_lost=True).ok
