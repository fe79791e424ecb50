"""The ops commands' pure parts: argument parsing, targets, lag arithmetic, change plans.
No Kafka, no Postgres, no Spark."""

from __future__ import annotations

import io
from datetime import UTC, datetime

import pytest

from pipeline import ops
from pipeline.cli import build_parser
from pipeline.errors import ConfigError, DataError
from pipeline.offsets import PartitionOffsets


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)


# ---- argument parsing --------------------------------------------------------------------

def test_backfill_offsets_args():
    a = parse("backfill", "--config", "c.toml", "--topic", "t", "--partition", "0",
              "--partition", "2", "--from-offset", "5", "--to-offset", "9", "--reprocess")
    assert (a.config, a.topic, a.partition, a.reprocess) == ("c.toml", "t", [0, 2], True)
    assert a.handler is ops.cmd_backfill
    assert ops.backfill_bounds(a) == ops.BackfillBounds(from_offset=5, to_offset=9)


def test_backfill_time_args_resolve_to_utc_milliseconds():
    a = parse("backfill", "--topic", "t", "--from-time", "2026-01-31T12:00:00Z",
              "--to-time", "2026-01-31T14:00:00+01:00")
    assert ops.backfill_bounds(a) == ops.BackfillBounds(
        from_ms=ms(2026, 1, 31, 12), to_ms=ms(2026, 1, 31, 13))


@pytest.mark.parametrize("argv, message", [
    (["--from-offset", "1"], "needs a range"),
    (["--from-offset", "1", "--to-offset", "3", "--from-time", "2026-01-01"], "not both"),
    (["--from-offset", "9", "--to-offset", "3"], "--to-offset 3 is before --from-offset 9"),
    (["--from-time", "2026-01-02", "--to-time", "2026-01-01"], "before --from-time"),
    (["--from-time", "yesterday", "--to-time", "2026-01-01"], "not an ISO 8601 time"),
])
def test_backfill_bad_ranges_are_config_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        ops.backfill_bounds(parse("backfill", "--topic", "t", *argv))


@pytest.mark.parametrize("argv", [
    ["backfill", "--from-offset", "1", "--to-offset", "2"],  # --topic missing
    ["backfill", "--topic", "t", "--from-offset", "-1", "--to-offset", "2"],
    ["backfill", "--topic", "t", "--partition", "x"],
    ["runs", "--last", "0"],
    ["runs", "--status", "done"],
    ["runs", "--kind", "batch"],
    ["offsets", "set", "--topic", "t"],  # set needs --to
    ["offsets"],  # an action is required
])
def test_bad_arguments_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parse(*argv)
    assert e.value.code == 2
    assert "error:" in capsys.readouterr().err


def test_offsets_config_is_accepted_before_and_after_the_action():
    before = parse("offsets", "--config", "a.toml", "set", "--topic", "t", "--to", "latest")
    after = parse("offsets", "set", "--config", "b.toml", "--topic", "t", "--to", "latest")
    default = parse("offsets", "show")
    assert (before.config, after.config) == ("a.toml", "b.toml")
    assert default.config.endswith(".toml")
    assert before.handler is ops.cmd_offsets_set and default.handler is ops.cmd_offsets_show


def test_reset_defaults_to_none_so_the_configured_start_applies():
    a = parse("offsets", "reset", "--topic", "t", "--partition", "1", "--yes")
    assert (a.to, a.partition, a.yes, a.offsets_command) == (None, [1], True, "reset")


def test_runs_args():
    a = parse("runs", "--last", "3", "--status", "failed", "--kind", "reprocess", "--json")
    assert (a.last, a.status, a.kind, a.json) == (3, "failed", "reprocess", True)
    assert parse("runs").last == 20


@pytest.mark.parametrize("text, kind, value", [
    ("earliest", "earliest", None),
    ("latest", "latest", None),
    ("1200", "offset", 1200),
    ("2026-01-31T12:00:00Z", "time", ms(2026, 1, 31, 12)),
    ("2026-01-31T12:00:00", "time", ms(2026, 1, 31, 12)),  # no zone = UTC
    ("2026-01-31", "time", ms(2026, 1, 31)),
])
def test_parse_target(text, kind, value):
    t = ops.parse_target(text)
    assert (t.kind, t.value, str(t)) == (kind, value, text)


@pytest.mark.parametrize("text", ["-5", "first", "12ab", ""])
def test_parse_target_rejects(text):
    with pytest.raises(ConfigError, match="--to"):
        ops.parse_target(text)


# ---- offsets set planning ------------------------------------------------------------------

K0 = PartitionOffsets("t", 0, 100, 200)
K1 = PartitionOffsets("t", 1, 0, 50)


def test_resolve_target_checks_what_kafka_holds():
    assert ops.resolve_target(ops.parse_target("earliest"), K0) == 100
    assert ops.resolve_target(ops.parse_target("latest"), K0) == 200
    assert ops.resolve_target(ops.parse_target("200"), K0) == 200  # latest: nothing to read
    assert ops.resolve_target(ops.parse_target("100"), K0) == 100
    for bad in ("99", "201"):
        with pytest.raises(DataError, match=r"t\[0\]: --to \d+ is outside what Kafka holds "
                                            r"\[100, 200\]"):
            ops.resolve_target(ops.parse_target(bad), K0)
    t = ops.parse_target("2026-01-01T00:00:00Z")
    assert ops.resolve_target(t, K0, {("t", 0): 150}) == 150


def test_plan_offset_changes_marks_new_rows_and_forgotten_partitions():
    changes = ops.plan_offset_changes({("t", 0): 150, ("t", 7): 3}, [K0, K1],
                                      ops.parse_target("earliest"), forget=[("t", 7)])
    assert [(c.partition, c.old, c.new) for c in changes] == [(0, 150, 100), (1, None, 0),
                                                              (7, 3, None)]
    table = ops.change_table(changes)
    assert "rewind 50" in table and "new row" in table and "forget" in table
    same = ops.plan_offset_changes({("t", 0): 200}, [K0], ops.parse_target("latest"))
    assert not same[0].changes


def test_select_partitions():
    kafka = [("t", 0), ("t", 1), ("u", 0)]
    assert ops.select_partitions("t", kafka, None) == ([0, 1], [])
    assert ops.select_partitions("t", kafka, [1, 1]) == ([1], [])
    assert ops.select_partitions("t", kafka, None, [("t", 0), ("t", 5)]) == ([0, 1], [5])
    assert ops.select_partitions("t", kafka, [5], [("t", 5)]) == ([], [5])
    with pytest.raises(DataError, match=r"t\[3\]: no such partition in Kafka \(the topic has "
                                        r"partitions 0-1\)"):
        ops.select_partitions("t", kafka, [0, 3])


def test_confirm():
    assert ops.confirm("go?", yes=True, stdin=io.StringIO(""))
    # No terminal: even a "y" on stdin is not a person saying yes.
    with pytest.raises(ConfigError, match="not a terminal.*--yes"):
        ops.confirm("go?", yes=False, stdin=io.StringIO("y\n"))

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = io.StringIO()
    assert ops.confirm("go?", yes=False, stdin=Terminal("y\n"), out=out)
    assert out.getvalue() == "go? [y/N] "
    assert not ops.confirm("go?", yes=False, stdin=Terminal("\n"), out=io.StringIO())
    assert not ops.confirm("go?", yes=False, stdin=Terminal("no\n"), out=io.StringIO())


# ---- lag ---------------------------------------------------------------------------------

def test_compute_lag():
    kafka = [PartitionOffsets("t", 0, 0, 100), PartitionOffsets("t", 1, 10, 40),
             PartitionOffsets("t", 2, 50, 60), PartitionOffsets("t", 3, 0, 5)]
    stored = {("t", 0): 70, ("t", 2): 20, ("t", 3): 9, ("t", 4): 1, ("other", 0): 5}
    rows = {r.partition: r for r in ops.compute_lag(stored, kafka, ["t"], "earliest")}
    assert (rows[0].stored, rows[0].lag, rows[0].note) == (70, 30, "")
    assert (rows[1].stored, rows[1].lag) == (None, 30)  # never read: from earliest 10
    assert "never read" in rows[1].note
    assert rows[2].lag == 40 and "data loss: [20, 50)" in rows[2].note
    assert rows[3].lag == -4 and "beyond latest" in rows[3].note
    assert rows[4].latest is None and "reset --topic t" in rows[4].note
    assert set(rows) == {0, 1, 2, 3, 4}  # topics not configured are left out
    totals = ops.lag_totals(list(rows.values()))
    assert totals == {"t": {"partitions": 5, "lag": 30 + 30 + 40 - 4, "max_lag": 40}}


def test_compute_lag_never_read_with_starting_latest_is_zero():
    rows = ops.compute_lag({}, [PartitionOffsets("t", 0, 10, 40)], ["t"], "latest")
    assert rows[0].lag == 0


# ---- output ------------------------------------------------------------------------------

def test_render_table_aligns_numbers_right_and_shows_none_as_dash():
    text = ops.render_table(["topic", "n"], [["a", 5], ["bbb", None], ["c", 1234]])
    assert text.splitlines() == ["topic     n", "a         5", "bbb       -", "c      1234"]


def test_run_what():
    ingest = {"kind": "ingest", "planned": [
        {"topic": "t", "partition": 0, "from": 0, "until": 5},
        {"topic": "t", "partition": 1, "from": 3, "until": 3},
        {"topic": "t", "partition": 2, "from": 1, "until": 2}]}
    assert ops.run_what(ingest) == "t[0] [0, 5) (+1 more)"
    change = {"kind": "offsets", "planned": [],
              "details": {"changes": [{"topic": "t", "partition": 1, "old": 9, "new": 2}]}}
    assert ops.run_what(change) == "t[1] 9->2"
    assert ops.run_what({"kind": "ingest", "planned": []}) == "-"
