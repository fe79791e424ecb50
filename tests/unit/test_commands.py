"""The commands' pure parts (pipeline/commands/): argument parsing, targets, lag arithmetic,
change plans, partition selection, output. No Kafka, no Postgres, no Spark."""

from __future__ import annotations

import io
from datetime import UTC, datetime
from pathlib import Path

import pytest

from pipeline.cli import build_parser, main
from pipeline.commands import backfill, lag, offsets, runs
from pipeline.commands.output import render_table
from pipeline.commands.partitions import select_partitions
from pipeline.errors import ConfigError, DataError
from pipeline.plan.offsets import PartitionOffsets


def parse(*argv: str):
    return build_parser().parse_args(list(argv))


def ms(*args: int) -> int:
    return int(datetime(*args, tzinfo=UTC).timestamp() * 1000)


# ---- argument parsing --------------------------------------------------------------------

def test_backfill_offsets_args():
    a = parse("backfill", "--config", "c.toml", "--topic", "t", "--partition", "0",
              "--partition", "2", "--from-offset", "5", "--to-offset", "9", "--reprocess")
    assert (a.config, a.topic, a.partition, a.reprocess) == ("c.toml", "t", [0, 2], True)
    assert a.handler is backfill.cmd_backfill
    assert backfill.backfill_bounds(a) == backfill.BackfillBounds(from_offset=5, to_offset=9)


def test_backfill_time_args_resolve_to_utc_milliseconds():
    a = parse("backfill", "--topic", "t", "--from-time", "2026-01-31T12:00:00Z",
              "--to-time", "2026-01-31T14:00:00+01:00")
    assert backfill.backfill_bounds(a) == backfill.BackfillBounds(
        from_ms=ms(2026, 1, 31, 12), to_ms=ms(2026, 1, 31, 13))


def test_a_rerun_of_the_same_backfill_command_has_the_same_resume_key():
    a = parse("backfill", "--topic", "t", "--partition", "2", "--partition", "0",
              "--from-offset", "5", "--to-offset", "9")
    b = parse("backfill", "--topic", "t", "--partition", "0", "--partition", "2",
              "--from-offset", "5", "--to-offset", "9", "--restart")
    key = backfill.resume_key(a.topic, a.partition, backfill.backfill_bounds(a))
    assert key == backfill.resume_key(b.topic, b.partition, backfill.backfill_bounds(b))
    assert key == {"topic": "t", "partitions": [0, 2], "from_offset": 5, "to_offset": 9}
    assert (a.restart, b.restart, a.dry_run) == (False, True, False)
    every = parse("backfill", "--topic", "t", "--from-offset", "5", "--to-offset", "9")
    assert backfill.resume_key("t", None, backfill.backfill_bounds(every))["partitions"] == "all"


@pytest.mark.parametrize("argv, message", [
    (["--from-offset", "1"], "needs a range"),
    (["--from-offset", "1", "--to-offset", "3", "--from-time", "2026-01-01"], "not both"),
    (["--from-offset", "9", "--to-offset", "3"], "--to-offset 3 is before --from-offset 9"),
    (["--from-time", "2026-01-02", "--to-time", "2026-01-01"], "before --from-time"),
    (["--from-time", "yesterday", "--to-time", "2026-01-01"], "not an ISO 8601 time"),
])
def test_backfill_bad_ranges_are_config_errors(argv, message):
    with pytest.raises(ConfigError, match=message):
        backfill.backfill_bounds(parse("backfill", "--topic", "t", *argv))


CONF = str(Path(__file__).resolve().parents[2] / "conf" / "local.toml")  # topic demo_orders

BAD_ARGUMENTS = [
    # refused by the parser (argparse's usage block before: the first four, and all others)
    (["backfill", "--topic", "t", "--from-offset", "-1", "--to-offset", "2"],
     "pipeline backfill: --from-offset must be an offset, a whole number >= 0 (got -1)"),
    (["runs", "--last", "0"], "pipeline runs: --last must be a positive integer (got 0)"),
    (["runs", "--status", "bogus"], "pipeline runs: --status must be one of running, "
                                    "succeeded, noop, failed, abandoned (got 'bogus')"),
    (["bogus"], "pipeline: unknown command 'bogus'; choose one of run, init-db, backfill"),
    ([], "pipeline: no command given; choose one of run, init-db"),
    (["-v"], "pipeline: no command given"),
    (["runs", "--last", "x"], "pipeline runs: --last must be a positive integer (got 'x')"),
    (["runs", "--last"], "pipeline runs: --last needs a value (see 'pipeline runs --help')"),
    (["runs", "--kind", "batch"], "pipeline runs: --kind must be one of ingest, backfill"),
    (["backfill", "--from-offset", "1", "--to-offset", "2"],
     "pipeline backfill: --topic is required (see 'pipeline backfill --help')"),
    (["backfill", "--topic", "t", "--to-offset", "1.5"],
     "pipeline backfill: --to-offset must be an offset, a whole number >= 0 (got '1.5')"),
    (["backfill", "--topic", "t", "--partition", "x"],
     "pipeline backfill: --partition must be a partition number"),
    (["offsets"], "pipeline offsets: no action given; choose one of show, set, reset"),
    (["offsets", "bogus"], "pipeline offsets: unknown action 'bogus'"),
    (["offsets", "set", "--topic", "t"], "pipeline offsets set: --to is required"),
    (["offsets", "set"], "pipeline offsets set: --topic and --to are required"),
    (["offsets", "reset", "--topic", "t", "--partition", "-1"],
     "pipeline offsets reset: --partition must be a partition number, a whole number >= 0 "
     "(got -1)"),
    (["lag", "--bogus"], "pipeline lag: unknown argument --bogus (see 'pipeline lag --help')"),
    (["offsets", "show", "extra"], "pipeline offsets show: unknown argument extra"),
    (["run", "--json=1"], "pipeline run: --json takes no value (got '1')"),
    # refused by the command, after the config is read and before anything connects
    (["backfill", "--config", CONF, "--topic", "demo_orders", "--from-offset", "1"],
     "a backfill needs a range"),
    (["backfill", "--config", CONF, "--topic", "demo_orders", "--from-offset", "9",
      "--to-offset", "3"], "--to-offset 3 is before --from-offset 9"),
    (["backfill", "--config", CONF, "--topic", "demo_orders", "--from-time", "yesterday",
      "--to-time", "2026-01-01"], "--from-time 'yesterday' is not an ISO 8601 time"),
    (["offsets", "set", "--config", CONF, "--topic", "nope", "--to", "latest"],
     "topic 'nope' is not one of pipeline"),
    (["offsets", "set", "--config", CONF, "--topic", "demo_orders", "--to", "-5"],
     "--to -5: offsets are >= 0"),
    (["lag", "--config", "/nonexistent/pipeline.toml"], "config file /nonexistent"),
]


@pytest.mark.parametrize("argv, message", BAD_ARGUMENTS)
def test_a_bad_argument_is_one_error_line_and_exit_2(argv, message, capsys):
    try:
        code = main(argv)
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    assert code == 2
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert message in err
    assert out == ""


def test_help_still_teaches(capsys):
    for argv in (["--help"], ["runs", "--help"], ["offsets", "set", "--help"]):
        with pytest.raises(SystemExit) as e:
            parse(*argv)
        assert e.value.code == 0
        out = capsys.readouterr().out
        assert out.startswith("usage: pipeline") and "examples:" in out
        assert "exit codes:" in out and "  75  transient" in out


def test_offsets_config_is_accepted_before_and_after_the_action():
    before = parse("offsets", "--config", "a.toml", "set", "--topic", "t", "--to", "latest")
    after = parse("offsets", "set", "--config", "b.toml", "--topic", "t", "--to", "latest")
    default = parse("offsets", "show")
    assert (before.config, after.config) == ("a.toml", "b.toml")
    assert default.config.endswith(".toml")
    assert before.handler is offsets.cmd_offsets_set and default.handler is offsets.cmd_offsets_show


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
    t = offsets.parse_target(text)
    assert (t.kind, t.value, str(t)) == (kind, value, text)


@pytest.mark.parametrize("text", ["-5", "first", "12ab", ""])
def test_parse_target_rejects(text):
    with pytest.raises(ConfigError, match="--to"):
        offsets.parse_target(text)


# ---- offsets set planning ------------------------------------------------------------------

K0 = PartitionOffsets("t", 0, 100, 200)
K1 = PartitionOffsets("t", 1, 0, 50)


def test_resolve_target_checks_what_kafka_holds():
    assert offsets.resolve_target(offsets.parse_target("earliest"), K0) == 100
    assert offsets.resolve_target(offsets.parse_target("latest"), K0) == 200
    assert offsets.resolve_target(offsets.parse_target("200"), K0) == 200  # latest: nothing to read
    assert offsets.resolve_target(offsets.parse_target("100"), K0) == 100
    for bad in ("99", "201"):
        with pytest.raises(DataError, match=r"t\[0\]: --to \d+ is outside what Kafka holds "
                                            r"\[100, 200\]"):
            offsets.resolve_target(offsets.parse_target(bad), K0)
    t = offsets.parse_target("2026-01-01T00:00:00Z")
    assert offsets.resolve_target(t, K0, {("t", 0): 150}) == 150


def test_plan_offset_changes_marks_new_rows_and_forgotten_partitions():
    changes = offsets.plan_offset_changes({("t", 0): 150, ("t", 7): 3}, [K0, K1],
                                      offsets.parse_target("earliest"), forget=[("t", 7)])
    assert [(c.partition, c.old, c.new) for c in changes] == [(0, 150, 100), (1, None, 0),
                                                              (7, 3, None)]
    table = offsets.change_table(changes)
    assert "rewind 50" in table and "new row" in table and "forget" in table
    same = offsets.plan_offset_changes({("t", 0): 200}, [K0], offsets.parse_target("latest"))
    assert not same[0].changes


def test_an_aggregate_refuses_only_moves_that_re_read_counted_records():
    """Counted: below the stored offset. Re-read: still in Kafka and at or after the new
    offset. A move forward, or to the new end of a log truncated below the stored offset,
    re-reads nothing."""
    def change(old, new, earliest=0, latest=10):
        return offsets.OffsetChange("t", 0, old, new, earliest, latest)

    assert offsets.recounted(change(10, 0)) == (0, 10)  # a real rewind
    assert offsets.recounted(change(10, 7)) == (7, 10)
    assert offsets.recounted(change(10, 10)) is None
    assert offsets.recounted(change(4, 10)) is None  # forward
    # The log was truncated from 15 to 10: its end re-reads nothing, its start everything.
    assert offsets.recounted(change(15, 10)) is None
    assert offsets.recounted(change(15, 0)) == (0, 10)
    # Retention deleted [0, 6): only what is left can be counted twice.
    assert offsets.recounted(change(10, 0, earliest=6)) == (6, 10)
    assert offsets.recounted(change(None, 0)) is None  # never read: nothing counted
    assert offsets.recounted(offsets.OffsetChange("t", 7, 3, None)) is None  # forgotten


def test_select_partitions():
    kafka = [("t", 0), ("t", 1), ("u", 0)]
    assert select_partitions("t", kafka, None) == ([0, 1], [])
    assert select_partitions("t", kafka, [1, 1]) == ([1], [])
    assert select_partitions("t", kafka, None, [("t", 0), ("t", 5)]) == ([0, 1], [5])
    assert select_partitions("t", kafka, [5], [("t", 5)]) == ([], [5])
    with pytest.raises(DataError, match=r"t\[3\]: no such partition in Kafka \(the topic has "
                                        r"partitions 0-1\)"):
        select_partitions("t", kafka, [0, 3])


def test_confirm():
    assert offsets.confirm("go?", yes=True, stdin=io.StringIO(""))
    # No terminal: even a "y" on stdin is not a person saying yes.
    with pytest.raises(ConfigError, match="not a terminal.*--yes"):
        offsets.confirm("go?", yes=False, stdin=io.StringIO("y\n"))

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    out = io.StringIO()
    assert offsets.confirm("go?", yes=False, stdin=Terminal("y\n"), out=out)
    assert out.getvalue() == "go? [y/N] "
    assert not offsets.confirm("go?", yes=False, stdin=Terminal("\n"), out=io.StringIO())
    assert not offsets.confirm("go?", yes=False, stdin=Terminal("no\n"), out=io.StringIO())


# ---- lag ---------------------------------------------------------------------------------

def test_compute_lag():
    kafka = [PartitionOffsets("t", 0, 0, 100), PartitionOffsets("t", 1, 10, 40),
             PartitionOffsets("t", 2, 50, 60), PartitionOffsets("t", 3, 0, 5)]
    stored = {("t", 0): 70, ("t", 2): 20, ("t", 3): 9, ("t", 4): 1, ("other", 0): 5}
    rows = {r.partition: r for r in lag.compute_lag(stored, kafka, ["t"], "earliest")}
    assert (rows[0].stored, rows[0].lag, rows[0].note) == (70, 30, "")
    assert (rows[1].stored, rows[1].lag) == (None, 30)  # never read: from earliest 10
    assert "never read" in rows[1].note
    assert rows[2].lag == 40 and "data loss: [20, 50)" in rows[2].note
    assert rows[3].lag == -4 and "beyond latest" in rows[3].note
    assert rows[4].latest is None and "reset --topic t" in rows[4].note
    assert set(rows) == {0, 1, 2, 3, 4}  # topics not configured are left out
    totals = lag.lag_totals(list(rows.values()))
    assert totals == {"t": {"partitions": 5, "lag": 30 + 30 + 40 - 4, "max_lag": 40}}


def test_compute_lag_never_read_with_starting_latest_is_zero():
    rows = lag.compute_lag({}, [PartitionOffsets("t", 0, 10, 40)], ["t"], "latest")
    assert rows[0].lag == 0


# ---- output ------------------------------------------------------------------------------

def test_render_table_aligns_numbers_right_and_shows_none_as_dash():
    text = render_table(["topic", "n"], [["a", 5], ["bbb", None], ["c", 1234]])
    assert text.splitlines() == ["topic     n", "a         5", "bbb       -", "c      1234"]


def test_run_what():
    ingest = {"kind": "ingest", "planned": [
        {"topic": "t", "partition": 0, "from": 0, "until": 5},
        {"topic": "t", "partition": 1, "from": 3, "until": 3},
        {"topic": "t", "partition": 2, "from": 1, "until": 2}]}
    assert runs.run_what(ingest) == "t[0] [0, 5) (+1 more)"
    change = {"kind": "offsets", "planned": [],
              "details": {"changes": [{"topic": "t", "partition": 1, "old": 9, "new": 2}]}}
    assert runs.run_what(change) == "t[1] 9->2"
    assert runs.run_what({"kind": "ingest", "planned": []}) == "-"
