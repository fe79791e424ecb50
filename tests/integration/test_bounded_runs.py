"""Bounded runs against the real stack: a run budget below the number of partitions with a
backlog starves none of them, a backfill runs as a sequence of run-sized transactions
(planned by --dry-run, resumed after a kill or a SIGTERM between chunks), and an
aggregate pipeline can move its offsets to the end of a truncated log."""

from __future__ import annotations

import json
import os
import signal
from pathlib import Path

import psycopg

from pipeline.cli import main
from tests.helpers import (
    TEST_DB_URL,
    cli_here,
    create_topic,
    init_cli,
    produce_orders,
    query,
    result_keys,
    run_cli,
    stored_offsets,
    toml_config,
    unique,
)
from tests.integration._reliability import finish, one_error_line, start_paused


def cli(capsys, *argv: str) -> tuple[int, str, str]:
    """The real CLI, in process (the test session's SparkSession is reused)."""
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def cli_json(capsys, *argv: str) -> dict:
    rc, out, err = cli(capsys, *argv, "--json")
    assert rc == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


def new_pipeline(tmp_path: Path, partitions: int, records: int, extra_kafka: str = "",
                 extra_sink: str = "") -> tuple[str, str, str]:
    """(name, topic, config): ``records`` orders in each partition, nothing read yet."""
    name, topic = unique("bnd"), create_topic(unique("bnd_t"), partitions)
    for p in range(partitions):
        produce_orders(topic, range(p * 1000, p * 1000 + records), partition=p)
    config = tmp_path / f"{name}.toml"
    config.write_text(toml_config(name, [topic], extra_kafka=extra_kafka,
                                  extra_sink=extra_sink))
    init_cli(config)
    return name, topic, str(config)


def every_offset(topic: str, partitions: int, records: int) -> list[tuple[str, int, int]]:
    return [(topic, p, o) for p in range(partitions) for o in range(records)]


def chunk_runs(name: str, kind: str = "backfill") -> list[tuple]:
    """(run_id, status, planned, details) of the pipeline's backfill chunk runs, oldest
    first."""
    return query("SELECT run_id, status, planned, details FROM pipeline_runs "
                 "WHERE pipeline = %s AND kind = %s ORDER BY run_id", (name, kind))


def covered(runs: list[tuple]) -> list[tuple[int, int]]:
    """Every (partition, offset) the succeeded runs planned, with repeats."""
    return sorted((r["partition"], o) for _, status, planned, _ in runs
                  if status == "succeeded" for r in planned for o in range(r["from"], r["until"]))


# ---- fair budgets --------------------------------------------------------------------------

def test_a_run_budget_below_the_backlogged_partitions_advances_every_partition(
        spark, tmp_path, capsys):
    """4 partitions x 10 records, 2 records a run: before, 8 runs stored 0=8,1=8 and
    partitions 2 and 3 never advanced."""
    name, topic, config = new_pipeline(tmp_path, 4, 10,
                                       extra_kafka="max_records_per_run = 2")
    for _ in range(2):  # ceil(4 partitions / 2 records a run)
        assert cli_json(capsys, "run", "--config", config)["status"] == "succeeded"
    assert stored_offsets(name) == {(topic, p): 1 for p in range(4)}
    # The dry run shows the plan of the run that follows it.
    planned = cli_json(capsys, "run", "--config", config, "--dry-run")["plan"]
    ran = cli_json(capsys, "run", "--config", config)
    assert [(p["partition"], p["from"], p["until"]) for p in ran["plan"]] == \
        [(p["partition"], p["from"], p["until"]) for p in planned]
    runs = 3
    while cli_json(capsys, "run", "--config", config)["status"] != "noop":
        runs += 1
        assert runs <= 20, stored_offsets(name)
        offsets = stored_offsets(name)
        # Every partition keeps pace: never more than one record ahead of another.
        assert max(offsets.values()) - min(offsets.values()) <= 1, offsets
    assert runs == 20  # 40 records, 2 a run
    assert result_keys(name) == every_offset(topic, 4, 10)  # each record once


# ---- bounded backfills -----------------------------------------------------------------------

CAPS = "max_records_per_partition = 10\nmax_records_per_run = 15"


def test_a_backfill_dry_run_prints_its_chunks_and_changes_nothing(spark, tmp_path, capsys):
    name, topic, config = new_pipeline(tmp_path, 2, 30, extra_kafka=CAPS)
    args = ("backfill", "--config", config, "--topic", topic, "--from-offset", "0",
            "--to-offset", "30", "--dry-run")

    rc, out, err = cli(capsys, *args)

    assert rc == 0, err[-3000:]
    assert "60 offsets in 4 transactions" in out, out
    assert "max_records_per_partition = 10" in out and "max_records_per_run = 15" in out
    assert "nothing read, nothing written" in out
    plan = cli_json(capsys, *args)
    assert plan["status"] == "planned" and plan["run_id"] is None
    assert [c["chunk"] for c in plan["chunks"]] == [1, 2, 3, 4]
    assert all(c["of"] == 4 and c["offsets"] <= 15 for c in plan["chunks"])
    assert all(r["offsets"] <= 10 for c in plan["chunks"] for r in c["ranges"])
    assert sorted((r["partition"], o) for c in plan["chunks"] for r in c["ranges"]
                  for o in range(r["from"], r["until"])) == \
        [(p, o) for p in range(2) for o in range(30)]
    # Nothing ran: no run row, no row, no offset, no staging table.
    assert chunk_runs(name) == [] and result_keys(name) == [] and stored_offsets(name) == {}


def test_a_capped_backfill_commits_each_chunk_in_its_own_run(spark, tmp_path):
    name, topic, config = new_pipeline(tmp_path, 2, 30, extra_kafka=CAPS)

    r = cli_here("backfill", "--config", config, "--topic", topic, "--from-offset", "0",
                "--to-offset", "30", "--json")

    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert (result["kind"], result["status"], result["resumed"]) == ("backfill", "succeeded", 0)
    assert (result["records_read"], result["rows_written"]) == (60, 60)
    runs = chunk_runs(name)
    assert [c["run_id"] for c in result["chunks"]] == [run[0] for run in runs]
    assert len(runs) == 4 and all(status == "succeeded" for _, status, _, _ in runs)
    for _, _, planned, details in runs:  # each one transaction within the caps of a run
        assert sum(p["until"] - p["from"] for p in planned) <= 15
        assert all(p["until"] - p["from"] <= 10 for p in planned)
        assert details["requested"] == {"from_offset": 0, "to_offset": 30}
    assert covered(runs) == [(p, o) for p in range(2) for o in range(30)]  # each once
    for i in range(1, 5):  # progress, one line per chunk, naming its ranges
        assert f"backfill chunk {i}/4: {topic}[" in r.stderr, r.stderr[-3000:]
    assert result_keys(name) == every_offset(topic, 2, 30)
    assert stored_offsets(name) == {}  # a backfill never moves offsets
    # The same command again is a new backfill (the first finished): it adds nothing.
    again = cli_here("backfill", "--config", config, "--topic", topic, "--from-offset", "0",
                    "--to-offset", "30", "--json")
    assert again.returncode == 0, again.stderr[-3000:]
    again_result = json.loads(again.stdout.strip().splitlines()[-1])
    assert (again_result["records_read"], again_result["rows_written"]) == (60, 0)
    assert again_result["resumed"] == 0 and len(again_result["chunks"]) == 4


def test_a_reprocess_killed_between_chunks_resumes_at_the_first_uncommitted_chunk(
        spark, tmp_path):
    """SIGKILL right after chunk 1's COMMIT; the same command again redoes nothing that
    committed (chunk 1's rows keep its run id) and finishes the rest, each offset once."""
    name, topic, config = new_pipeline(tmp_path, 2, 30, extra_kafka=CAPS)
    args = ("backfill", "--config", config, "--topic", topic, "--from-offset", "0",
            "--to-offset", "30", "--reprocess")

    killed = run_cli(*args, env={"PIPELINE_FAULT": "after_commit:kill"})

    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    [(first_run, status, first_planned, _)] = chunk_runs(name, "reprocess")
    assert status == "succeeded"
    first = {(r["partition"], o) for r in first_planned for o in range(r["from"], r["until"])}
    assert {(p, o) for _, p, o in result_keys(name)} == first

    dry = cli_here(*args, "--dry-run")
    assert dry.returncode == 0 and "resuming: chunks 1-1 of 4" in dry.stdout, dry.stdout
    r = cli_here(*args, "--json")

    assert r.returncode == 0, r.stderr[-3000:]
    result = json.loads(r.stdout.strip().splitlines()[-1])
    assert result["resumed"] == 1 and [c["chunk"] for c in result["chunks"]] == [2, 3, 4]
    assert result["records_read"] == 60 - len(first)
    runs = chunk_runs(name, "reprocess")
    assert covered(runs) == [(p, o) for p in range(2) for o in range(30)]  # each once
    assert result_keys(name) == every_offset(topic, 2, 30)
    rows = dict(((p, o), run) for p, o, run in query(
        f'SELECT "partition", "offset", run_id FROM {name}'))
    assert all(rows[c] == first_run for c in first)  # chunk 1 was not redone
    assert all(rows[c] != first_run for c in set(rows) - first)


def test_a_sigterm_between_chunks_stops_cleanly_and_keeps_what_committed(spark, tmp_path):
    name, topic, config = new_pipeline(tmp_path, 2, 30, extra_kafka=CAPS)
    args = ("backfill", "--config", config, "--topic", topic, "--from-offset", "0",
            "--to-offset", "30")
    # Asleep right after chunk 1 committed: the moment between two chunks.
    proc = start_paused(*args, point="after_commit", seconds=60)
    os.kill(proc.pid, signal.SIGTERM)
    rc, _, err = finish(proc)

    assert rc == 143, err[-3000:]
    line = one_error_line(err)
    assert "stopped by SIGTERM" in line and "backfill chunks 1-1 of 4 are committed" in line \
        and "resume at chunk 2" in line, line
    runs = chunk_runs(name)
    assert [status for _, status, _, _ in runs] == ["succeeded"]
    assert len(result_keys(name)) == len(covered(runs)) == 15
    assert query("SELECT count(*) FROM pg_tables WHERE tablename LIKE %s",
                 (f"_stage_{name[:24]}%",), db_url=TEST_DB_URL) == [(0,)]

    r = cli_here(*args)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "resumed: chunks 1-1" in r.stdout, r.stdout
    assert covered(chunk_runs(name)) == [(p, o) for p in range(2) for o in range(30)]
    assert result_keys(name) == every_offset(topic, 2, 30)


# ---- aggregate: offsets to the end of a truncated log ---------------------------------------

AGGREGATE_SINK = ('mode = "aggregate"\ngroup_by = ["customer"]\n[sink.aggregates]\n'
                  'orders = "count(*)"\n')


def counted(name: str) -> int:
    return query(f"SELECT coalesce(sum(orders), 0) FROM {name}")[0][0]


def test_an_aggregate_follows_a_truncated_log_forward_and_still_refuses_rewinds(
        spark, tmp_path):
    name, topic, config = new_pipeline(tmp_path, 1, 10, extra_sink=AGGREGATE_SINK)
    r = cli_here("run", "--config", config)
    assert r.returncode == 0, r.stderr[-3000:]
    assert counted(name) == 10 and stored_offsets(name) == {(topic, 0): 10}
    # The log lost its end [10, 15) after they were counted (an unclean leader election;
    # one broker cannot lose it, so the offsets say what such a run left: 15).
    with psycopg.connect(TEST_DB_URL, autocommit=True) as conn:
        conn.execute("UPDATE pipeline_offsets SET next_offset = 15 WHERE pipeline = %s",
                     (name,))
    r = cli_here("run", "--config", config)
    assert r.returncode == 3, r.stderr[-3000:]
    assert "--to latest" in one_error_line(r.stderr)

    # Back to offsets still in the log would count them twice: refused, nothing changed.
    for target in ("earliest", "5"):
        r = cli_here("offsets", "set", "--config", config, "--topic", topic, "--to", target,
                    "--yes")
        assert r.returncode == 2, r.stderr[-3000:]
        line = one_error_line(r.stderr)
        start = 0 if target == "earliest" else int(target)
        assert "count them again" in line and f"re-reads offsets [{start}, 10)" in line, line
    assert stored_offsets(name) == {(topic, 0): 15}

    # To the log's new end: nothing is read twice (before: refused as a rewind).
    r = cli_here("offsets", "set", "--config", config, "--topic", topic, "--to", "latest",
                "--yes")
    assert r.returncode == 0, r.stderr[-3000:]
    assert stored_offsets(name) == {(topic, 0): 10}
    produce_orders(topic, range(100, 105), partition=0)  # new records at offsets [10, 15)
    r = cli_here("run", "--config", config)
    assert r.returncode == 0, r.stderr[-3000:]
    assert counted(name) == 15 and stored_offsets(name) == {(topic, 0): 15}  # each once
    # Forward past records never read skips them, counting nothing twice: allowed.
    produce_orders(topic, range(200, 205), partition=0)
    r = cli_here("offsets", "set", "--config", config, "--topic", topic, "--to", "17", "--yes")
    assert r.returncode == 0, r.stderr[-3000:]
    assert stored_offsets(name) == {(topic, 0): 17}


