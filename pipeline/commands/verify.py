"""``pipeline verify``: prove that the results and dead-letter tables match the topic for
every range the pipeline published (driver/verify.py). Read-only; exit 3 on a mismatch."""

from __future__ import annotations

import argparse

from pipeline.commands.args import add_command, add_range_filters
from pipeline.commands.output import print_json, render_table
from pipeline.config import Settings
from pipeline.errors import EXIT_OK, ConfigError, DataError


def describe(m: dict) -> str:
    if "until" in m:  # a ledger row: a whole range, published by one run
        return (f"{m['topic']}[{m['partition']}] offsets [{m['offset']}, {m['until']}) of run "
                f"{m['run_id']}: {m['kind']} ({m['what']})")
    return f"{m['topic']}[{m['partition']}] offset {m['offset']}: {m['kind']} ({m['what']})"


def ledger_cell(p) -> str:
    """The ledger's rows checked: re-read and hashed / in all (the rest: the tables only)."""
    return f"{p.ledger_hashed}/{p.ledger_ranges} hashed" if p.ledger_ranges else "-"


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    from pipeline.driver.verify import SKIP_KINDS, Filters, run_verify

    if args.from_offset is not None and args.to_offset is not None \
            and args.to_offset <= args.from_offset:
        raise ConfigError(f"--to ({args.to_offset}) must be greater than --from "
                          f"({args.from_offset}): the range is [from, to)")
    if settings.sink.mode != "append" and not settings.sink.transform:
        return verify_state(args, settings)
    if args.values and settings.sink.transform:
        raise ConfigError(f"pipeline '{settings.name}': --values cannot recompute the rows of "
                          f"the [sink] transform {settings.sink.transform!r} without running "
                          "it; verify without --values checks its ranges against the ledger")
    filters = Filters(args.topic, args.partition, args.from_offset, args.to_offset)
    report = run_verify(settings, filters, args.spark)
    values = None
    if args.values:
        from pipeline.driver.verify_state import run_state_verify

        values = run_state_verify(settings, args.topic, filters)
    if args.json:
        print_json({**report.as_dict(), "ok": report.ok and (values is None or values.ok),
                    **({"values": values.as_dict()} if values else {})})
    else:
        print(render_table(
            ["topic", "partition", "ranges", "records", "rows", "dead", "missing",
             "unexpected", "dup", "unpublished", "not_verifiable", "ledger", "verdict"],
            [[p.topic, p.partition, len(p.ranges), p.expected, p.rows, p.dead_letters,
              p.missing, p.unexpected, p.duplicates, p.unpublished,
              "; ".join(f"[{n['from']}, {n['until']}) {n['why']}" for n in p.not_verifiable)
              or "-", ledger_cell(p), "match" if p.ok else "MISMATCH"]
             for p in report.partitions]))
        for p in report.partitions:
            if p.skipped:
                print(f"{p.topic}[{p.partition}]: {sum(p.skipped.values())} offset(s) "
                      "skipped, no record to verify: " + ", ".join(
                          f"{n} {SKIP_KINDS[k]}" for k, n in p.skipped.items()))
            if p.filtered:
                print(f"{p.topic}[{p.partition}]: {p.filtered} record(s) in neither table, "
                      "filtered out by the transform (the ledger's counts and hash check "
                      "them)")
            for n in p.ledger_only[:5]:
                print(f"{p.topic}[{p.partition}] offsets [{n['from']}, {n['until']}) of run "
                      f"{n['run_id']}: {n['why']}")
        for m in report.first_mismatches(20):
            print(describe(m))
        if values is not None:
            print_values(values)
    n = len(report.partitions)
    if values is not None and not values.ok:
        first = values.missing_keys[:3] or values.unexpected_keys[:3]
        raise DataError(
            f"verify --values: MISMATCH: {values.missing} row(s) of {settings.sink.table} "
            "differ from the rows their Kafka records make (first at topic, partition, "
            f"offset: {'; '.join('(' + ', '.join(k) + ')' for k in first)}); inspect them "
            "with 'pipeline verify --values --json'; rewrite a range from Kafka with "
            "'pipeline backfill --reprocess' over its offsets")
    if report.ok:
        skipped = sum(len(p.not_verifiable) for p in report.partitions)
        if not args.json:
            print(f"verified: the tables match Kafka on {n} partition(s)" + (
                f" ({skipped} range(s) not verifiable, see above)" if skipped else "")
                if n else "nothing to verify: no succeeded run published a range "
                "that matches the filters")
        return EXIT_OK
    bad = [p for p in report.partitions if not p.ok]
    verdict = f"MISMATCH: {len(bad)} of {n} partition(s) do not match Kafka"
    if not args.json:
        print(verdict)
    first = "; ".join(describe(m) for m in report.first_mismatches(3))
    raise DataError(f"verify: {verdict}: {first}; inspect them with 'pipeline verify "
                    "--json'; re-read missing records with 'pipeline backfill --reprocess' "
                    "over their offsets, which also replaces what the range held")


def print_values(values) -> None:
    """``--values``: the rows compared one by one with the rows their records make."""
    for n in values.not_verifiable:
        print(f"{n['topic']}[{n['partition']}]: values not compared ({n['why']})")
    for name, keys in (("differs from its record", values.missing_keys),
                       ("is not what its record makes", values.unexpected_keys)):
        for k in keys:
            print(f"row at ({', '.join(k)}): {name}")
    if values.compared:
        print(f"values: {values.table_rows} row(s) compared with {values.state_rows} made "
              f"from their records: " + ("match" if values.ok else
                                         f"{values.missing} differ"))


def verify_state(args: argparse.Namespace, settings: Settings) -> int:
    """An upsert or aggregate sink: its state recomputed from Kafka (driver/verify_state.py)."""
    from pipeline.driver.verify_state import check_filters, run_state_verify

    check_filters(settings, args.partition, args.from_offset, args.to_offset, args.topic)
    if args.values:
        raise ConfigError(f"pipeline '{settings.name}': --values is for append sinks; an "
                          f"{settings.sink.mode} sink's verify compares its values always")
    report = run_state_verify(settings, args.topic)
    what = "key" if report.mode == "upsert" else "group"
    if args.json:
        print_json(report.as_dict())
    else:
        print(render_table(["mode", "records", "state_rows", "table_rows", "missing",
                            "unexpected", "verdict"],
                           [[report.mode, report.records, report.state_rows,
                             report.table_rows, report.missing, report.unexpected,
                             "match" if report.ok else "MISMATCH"]]))
        for n in report.not_verifiable:
            where = n["topic"] + ("" if n["partition"] is None else f"[{n['partition']}]")
            print(f"{where}: not verifiable ({n['why']}): the state can only be recomputed "
                  "from every record published; nothing compared")
        for name, keys in (("missing", report.missing_keys),
                           ("unexpected", report.unexpected_keys)):
            for k in keys:
                print(f"{what} ({', '.join(k)}): {name}")
    if report.ok:
        if not args.json and report.compared:
            print(f"verified: {settings.sink.table} holds exactly the state of "
                  f"{report.records} records ({report.state_rows} {what}s)")
        return EXIT_OK
    first = report.missing_keys[:3] or report.unexpected_keys[:3]
    raise DataError(
        f"verify: MISMATCH: {settings.sink.table} differs from the state Kafka's records make "
        f"({report.missing} {what}(s) missing or changed, {report.unexpected} unexpected; "
        f"first: {'; '.join('(' + ', '.join(k) + ')' for k in first)}); inspect them with "
        "'pipeline verify --json'")


VERIFY_HELP = """\
Re-reads from Kafka every range that a succeeded run (ingest, backfill, reprocess) published
and reconciles it, per partition, with the results and dead-letter tables: each record
Kafka returns must be in exactly one of them, and no row or dead letter may claim an offset
that is no record (a forged row; an aborted, compacted or transaction-marker offset) or
that no run published. Offsets Kafka skips (markers, aborted records, compaction) are fine
as long as no row claims them; ranges retention has deleted are reported as not
verifiable, not as errors. Then the ledger (pipeline_ranges, one row per published read
range): each range Kafka still holds whole is re-read and its record count and content
hash compared with what the run published (a changed record or a recreated topic is named
by range and run), and the tables' rows + dead letters per range with the ledger's; a
range retention deleted is checked against the ledger only (listed as such). An upsert or
aggregate sink's table is state: every published record is re-read and encoded as a run
does, the newest record per key (tombstones deleting) or the totals per group computed in
a temporary table, and compared with the table both ways (not when retention has deleted
published records: said so). With --values, an append sink's rows are compared the same
way, one by one with the rows their records make (a value changed in the table is named
by its coordinates). Skipped offsets are counted per partition by why (aborted,
transaction marker, compacted, retention-deleted). With a [sink] transform (append sinks),
records in neither table are counted as filtered, and the ledger's counts and hashes prove
the rest (the rows' values cannot be recomputed without the transform). Read-only: one
snapshot of the tables, Kafka read a batch at a time; --spark moves the ledger's re-read
and hash to Spark tasks."""

VERIFY_EXAMPLES = """\
examples:
  pipeline verify --config conf/local.toml
  pipeline verify --config conf/local.toml --topic orders --partition 3 --from 1000 --to 2000
  pipeline verify --config conf/local.toml --values
  pipeline verify --config conf/local.toml --json | jq '.partitions[] | select(.ok | not)'
"""


def register(sub) -> None:
    verify = add_command(sub, "verify", "Prove that the tables match the topic for every "
                         "range the pipeline published.", VERIFY_HELP, VERIFY_EXAMPLES)
    add_range_filters(verify, "report")
    verify.add_argument("--values", action="store_true",
                        help="append sinks: also compare every row's values with the row "
                        "its Kafka record makes now (re-encodes each record; slower)")
    verify.add_argument("--spark", choices=("auto", "always", "never"), default="auto",
                        help="re-read and hash the ledger's ranges as Spark tasks (the "
                        "pipeline's [spark] master): always, never (on this process), or "
                        "auto (default: when the ranges verified span 500,000 offsets or "
                        "more and [spark] master is a cluster, not local)")
    verify.set_defaults(handler=cmd_verify)
