"""``pipeline verify``: prove that the results and dead-letter tables match the topic for
every range the pipeline published (driver/verify.py). Read-only. Exit 0: everything in the
scope compared and matching; 3: a mismatch; 4: no mismatch, but not everything compared
(driver/verdict.py)."""

from __future__ import annotations

import argparse

from pipeline.commands.args import add_command, add_range_filters
from pipeline.commands.output import print_json, render_table
from pipeline.config import Settings
from pipeline.errors import EXIT_OK, ConfigError, DataError, IncompleteError

SHOWN = 5  # not-compared ranges named per partition in the text output and the error


def describe(m: dict) -> str:
    if "until" in m:  # a ledger row: a whole range, published by one run
        return (f"{m['topic']}[{m['partition']}] offsets [{m['offset']}, {m['until']}) of run "
                f"{m['run_id']}: {m['kind']} ({m['what']})")
    return f"{m['topic']}[{m['partition']}] offset {m['offset']}: {m['kind']} ({m['what']})"


def not_compared(topic: str, partition, n: dict) -> str:
    """One thing verify could not compare: ``{from, until, why}`` of a partition."""
    where = f"{topic}[{partition}]" if partition is not None else topic
    if n.get("from") is None:
        return f"{where}: not compared ({n['why']})"
    if n["until"] - n["from"] == 1:
        return f"{where} offset {n['from']}: not compared ({n['why']})"
    return f"{where} offsets [{n['from']}, {n['until']}): not compared ({n['why']})"


def ledger_cell(p) -> str:
    """The ledger's rows checked: re-read and hashed / in all (the rest: the tables only)."""
    return f"{p.ledger_hashed}/{p.ledger_ranges} hashed" if p.ledger_ranges else "-"


def cmd_verify(args: argparse.Namespace, settings: Settings) -> int:
    """Each table of the pipeline in turn (or --table's, --topic's): its verdict, then the
    worst one's exit code, naming the tables that do not match."""
    from pipeline.driver.routing import run_topics, table_scopes
    from pipeline.driver.verdict import worst

    topics = settings.kafka.topics
    if settings.routes.one_table is None and settings.kafka.topic_pattern is not None:
        from pipeline.driver.kafka_meta import KafkaMeta

        topics = run_topics(settings, KafkaMeta(settings.kafka))
    scopes = table_scopes(settings, topics, table=getattr(args, "table", None), topic=args.topic)
    if scopes[0].topics is None:  # a pipeline of one table: as it always was
        return verify_table(args, scopes[0].settings, print_json)
    docs: dict[str, dict] = {}
    failed: list[tuple[str, DataError | IncompleteError]] = []
    for scope in scopes:
        if not args.json:
            print(f"table {scope.table} ({', '.join(scope.topics or ())}):")
        try:
            verify_table(args, scope.settings, lambda d, t=scope.table: docs.update({t: d}),
                         scope.topics)
        except (DataError, IncompleteError) as e:
            failed.append((scope.table, e))
    overall = worst(d["verdict"] for d in docs.values())
    if args.json:
        print_json({"pipeline": settings.name, "verdict": overall, "ok": not failed,
                    "tables": docs})
    mismatched = [(t, e) for t, e in failed if isinstance(e, DataError)]
    if mismatched or failed:
        (_, e), *_ = mismatched or failed
        names = ", ".join(t for t, _ in (mismatched or failed))
        raise type(e)(f"verify: table(s) {names} of pipeline '{settings.name}': {e.message}")
    if not args.json:
        print(f"verified: {len(scopes)} table(s) match Kafka: "
              + ", ".join(s.table for s in scopes))
    return EXIT_OK


def verify_table(args: argparse.Namespace, settings: Settings, emit,
                 topics: tuple[str, ...] | None = None) -> int:
    """One table's verify (``settings``: [sink] its route); ``emit``: where its JSON
    document goes; ``topics``: the table's topics (None: every topic the pipeline
    published, a pipeline of one table)."""
    from pipeline.driver.verdict import MATCH, MISMATCH, worst
    from pipeline.driver.verify import SKIP_KINDS, Filters, run_verify

    if args.from_offset is not None and args.to_offset is not None \
            and args.to_offset <= args.from_offset:
        raise ConfigError(f"--to ({args.to_offset}) must be greater than --from "
                          f"({args.from_offset}): the range is [from, to)")
    if settings.sink.mode != "append" and not settings.sink.transform:
        return verify_state(args, settings, emit, topics)
    if args.values and settings.sink.transform:
        raise ConfigError(f"pipeline '{settings.name}': --values cannot recompute the rows of "
                          f"the [sink] transform {settings.sink.transform!r} without running "
                          "it; verify without --values checks its ranges against the ledger")
    filters = Filters(args.topic, args.partition, args.from_offset, args.to_offset, topics)
    report = run_verify(settings, filters, args.spark, args.skip_lost)
    values = None
    if args.values:
        from pipeline.driver.verify_state import run_state_verify

        values = run_state_verify(settings, args.topic, filters, args.skip_lost, topics)
    overall = worst([report.verdict] + ([values.verdict] if values else []))
    if args.json:
        emit({**report.as_dict(), "verdict": overall, "ok": overall == MATCH,
                    **({"values": values.as_dict()} if values else {})})
    else:
        print(render_table(
            ["topic", "partition", "ranges", "records", "rows", "dead", "missing",
             "unexpected", "dup", "unpublished", "not_compared", "ledger", "verdict"],
            [[p.topic, p.partition, len(p.ranges), p.expected, p.rows, p.dead_letters,
              p.missing, p.unexpected, p.duplicates, p.unpublished,
              p.not_compared_offsets or None, ledger_cell(p), p.verdict]
             for p in report.partitions]))
        for p in report.partitions:
            for n in p.not_compared[:SHOWN]:
                print(not_compared(p.topic, p.partition, n))
            if len(p.not_compared) > SHOWN or p.not_compared_offsets > sum(
                    n["until"] - n["from"] for n in p.not_compared):
                print(f"{p.topic}[{p.partition}]: {p.not_compared_offsets} offset(s) not "
                      "compared in all (--json lists the first ones)")
            if p.skipped:
                print(f"{p.topic}[{p.partition}]: {sum(p.skipped.values())} offset(s) "
                      "skipped, no record to verify: " + ", ".join(
                          f"{n} {SKIP_KINDS[k]}" for k, n in p.skipped.items()))
            if p.filtered:
                print(f"{p.topic}[{p.partition}]: {p.filtered} record(s) in neither table, "
                      "filtered out by the transform (the ledger's counts and hash check "
                      "them)")
            for n in p.ledger_only[:SHOWN]:
                print(f"{p.topic}[{p.partition}] offsets [{n['from']}, {n['until']}) of run "
                      f"{n['run_id']}: {n['why']}")
        for m in report.first_mismatches(20):
            print(describe(m))
        if values is not None:
            print_values(values)
    n = len(report.partitions)
    if values is not None and values.verdict == MISMATCH:
        first = values.missing_keys[:3] or values.unexpected_keys[:3]
        raise DataError(
            f"verify --values: MISMATCH: {values.missing} row(s) of {settings.sink.table} "
            "differ from the rows their Kafka records make (first at topic, partition, "
            f"offset: {'; '.join('(' + ', '.join(k) + ')' for k in first)}); inspect them "
            "with 'pipeline verify --values --json'; rewrite a range from Kafka with "
            "'pipeline backfill --reprocess' over its offsets")
    if report.verdict == MISMATCH:
        bad = [p for p in report.partitions if p.verdict == MISMATCH]
        verdict = f"MISMATCH: {len(bad)} of {n} partition(s) do not match Kafka"
        if not args.json:
            print(verdict)
        first = "; ".join(describe(m) for m in report.first_mismatches(3))
        raise DataError(f"verify: {verdict} (table {settings.sink.table}): {first}; inspect them "
                        "with 'pipeline verify --json'; re-read missing records with "
                        "'pipeline backfill --reprocess' over their offsets, which also "
                        "replaces what the range held")
    if overall != MATCH:
        raise incomplete([(p.topic, p.partition, p.not_compared or p.ledger_only)
                          for p in report.partitions if p.verdict != MATCH] + (
            [(x["topic"], x["partition"], x["not_compared"]) for x in values.partitions
             if x["verdict"] != MATCH] if values else []), n)
    if not args.json:
        left = sum(1 for p in report.partitions if p.not_compared or p.ledger_only)
        print(f"verified: the tables match Kafka on {n} partition(s)" + (
            f" ({left} with records Kafka no longer holds left out, --skip-lost; see above)"
            if left else "") if n else "nothing to verify: no succeeded run published a "
            "range that matches the filters, and the tables hold no row there")
    return EXIT_OK


def incomplete(parts: list[tuple], n: int, narrow: str = " (or narrow it with "
               "--partition, --from)") -> IncompleteError:
    """Exit 4: nothing differs, but these partitions' ``(topic, partition, what could not
    be compared)`` were in the scope."""
    seen = list(dict.fromkeys((t, p) for t, p, _ in parts))
    first = "; ".join(dict.fromkeys(not_compared(t, p, x) for t, p, xs in parts
                                    for x in xs[:1]))
    return IncompleteError(
        f"verify: INCOMPLETE: no mismatch, but {len(seen)} of {n} partition(s) could not be "
        f"compared whole: Kafka no longer holds records the pipeline published ({first}); "
        "to verify what it holds and leave the rest out of the scope, add --skip-lost"
        + narrow)


def print_values(values) -> None:
    """``--values``: the rows compared one by one with the rows their records make."""
    for name, keys in (("differs from its record", values.missing_keys),
                       ("is not what its record makes", values.unexpected_keys)):
        for k in keys:
            print(f"row at ({', '.join(k)}): {name}")
    print(f"values: {values.table_rows} row(s) compared with {values.state_rows} made from "
          "their records: " + (f"{values.missing} differ" if values.differs else
                                values.verdict) + (
              f" ({values.rows_not_compared} row(s) of records Kafka no longer holds not "
              "compared)" if values.rows_not_compared else ""))


def verify_state(args: argparse.Namespace, settings: Settings, emit=print_json,
                 topics: tuple[str, ...] | None = None) -> int:
    """An upsert or aggregate sink: its state recomputed from Kafka (driver/verify_state.py);
    ``emit`` and ``topics`` as verify_table's."""
    from pipeline.driver.verdict import MATCH, MISMATCH
    from pipeline.driver.verify_state import check_filters, run_state_verify

    check_filters(settings, args.partition, args.from_offset, args.to_offset, args.topic)
    if args.values:
        raise ConfigError(f"pipeline '{settings.name}': --values is for append sinks; an "
                          f"{settings.sink.mode} sink's verify compares its values always")
    report = run_state_verify(settings, args.topic, skip_lost=args.skip_lost, topics=topics)
    what = "key" if report.mode == "upsert" else "group"
    if args.json:
        emit(report.as_dict())
    else:
        print(render_table(["mode", "records", "state_rows", "table_rows", "missing",
                            "unexpected", "verdict"],
                           [[report.mode, report.records, report.state_rows,
                             report.table_rows, report.missing, report.unexpected,
                             report.verdict]]))
        print(render_table(["topic", "partition", "records", "missing", "unexpected",
                            "not_compared", "verdict"],
                           [[p["topic"], p["partition"], p["records"], p.get("missing"),
                             p.get("unexpected"), len(p["not_compared"]) or None,
                             p["verdict"]] for p in report.partitions]))
        for n in report.not_compared[:SHOWN]:
            print(not_compared(n["topic"], n["partition"], n))
        if report.rows_not_compared:
            print(f"{report.rows_not_compared} row(s) of {settings.sink.table} made by those "
                  "records: not compared")
        if report.nothing_compared:
            print(f"nothing compared: {report.nothing_compared}")
        for name, keys in (("missing", report.missing_keys),
                           ("unexpected", report.unexpected_keys)):
            for k in keys:
                print(f"{what} ({', '.join(k)}): {name}")
    if report.verdict == MISMATCH:
        first = report.missing_keys[:3] or report.unexpected_keys[:3]
        raise DataError(
            f"verify: MISMATCH: {settings.sink.table} differs from the state Kafka's records "
            f"make ({report.missing} {what}(s) missing or changed, {report.unexpected} "
            f"unexpected; first: {'; '.join('(' + ', '.join(k) + ')' for k in first)}); "
            "inspect them with 'pipeline verify --json'")
    if report.verdict != MATCH:
        if report.nothing_compared:
            raise IncompleteError(
                f"verify: INCOMPLETE: nothing compared: {report.nothing_compared} ("
                + "; ".join(not_compared(n["topic"], n["partition"], n)
                            for n in report.not_compared[:3]) + "); the table cannot be "
                "verified against Kafka any more")
        raise incomplete([(p["topic"], p["partition"], p["not_compared"])
                          for p in report.partitions if p["verdict"] != MATCH],
                         len(report.partitions), "")
    if not args.json:
        print(f"verified: {settings.sink.table} holds exactly the state of "
              f"{report.records} records ({report.state_rows} {what}s)" + (
                  f"; {report.rows_not_compared} row(s) made by records Kafka no longer "
                  "holds left out (--skip-lost)" if report.rows_not_compared else ""))
    return EXIT_OK


VERIFY_HELP = """\
Re-reads from Kafka every range that a succeeded run (ingest, backfill, reprocess) published
and reconciles it, per partition, with the results and dead-letter tables: each record
Kafka returns must be in exactly one of them, and no row or dead letter may claim an offset
that is no record (a forged row; an aborted or transaction-marker offset) or that no run
published (in any partition or topic the tables hold rows of). Offsets Kafka skips
(markers, aborted records, compaction) are fine as long as no row claims them. Then the
ledger (pipeline_ranges, one row per published read range): each range Kafka still holds
whole is re-read and its record count and content hash compared with what the run
published (a changed record or a recreated topic is named by range and run), and the
tables' rows + dead letters per range with the ledger's. An upsert or aggregate sink's
table is state: every published record is re-read and encoded as a run does, the newest
record per key (tombstones deleting) or the totals per group computed in a temporary
table, and compared with the table both ways. With --values, an append sink's rows are
compared the same way, one by one with the rows their records make (a value changed in the
table is named by its coordinates). With a [sink] transform (append sinks), records in
neither table are counted as filtered, and the ledger's counts and hashes prove the rest.

Published records Kafka no longer holds (deleted by retention, also while verify reads;
compacted away after they were published; a partition gone) cannot be compared: they are
named as "not compared" (a range checked against the ledger's counts only, a row whose
record is gone, the keys such rows decide in an upsert table; an aggregate's totals are
then not compared at all), and every other partition is still compared. Each partition,
and the whole, has one verdict: "match" (everything in the scope compared, and equal),
"mismatch" (a difference found) or "incomplete" (no difference, but not everything
compared). --skip-lost leaves what Kafka no longer holds out of the scope (still listed).

Read-only: a snapshot of the tables per window of at most 1,000,000 published offsets of a
partition, Kafka read a batch at a time; --spark moves the ledger's re-read and hash to
Spark tasks. Exit 0: match; 3: mismatch; 4: incomplete; 75: Kafka or Postgres unreachable
(verify again later)."""

VERIFY_EXAMPLES = """\
examples:
  pipeline verify --config conf/local.toml
  pipeline verify --config conf/local.toml --topic orders --partition 3 --from 1000 --to 2000
  pipeline verify --config conf/local.toml --values
  pipeline verify --config conf/local.toml --skip-lost   # only what Kafka still holds
  pipeline verify --config conf/local.toml --json | jq '.partitions[] | select(.ok | not)'
"""


def register(sub) -> None:
    verify = add_command(sub, "verify", "Prove that the tables match the topic for every "
                         "range the pipeline published.", VERIFY_HELP, VERIFY_EXAMPLES)
    add_range_filters(verify, "report")
    verify.add_argument("--table", metavar="TABLE",
                        help="a pipeline of several tables: verify this one only (default: "
                        "each in turn)")
    verify.add_argument("--values", action="store_true",
                        help="append sinks: also compare every row's values with the row "
                        "its Kafka record makes now (re-encodes each record; slower)")
    verify.add_argument("--spark", choices=("auto", "always", "never"), default="auto",
                        help="re-read and hash the ledger's ranges as Spark tasks (the "
                        "pipeline's [spark] master): always, never (on this process), or "
                        "auto (default: when the ranges verified span 500,000 offsets or "
                        "more and [spark] master is a cluster, not local)")
    verify.add_argument("--skip-lost", action="store_true",
                        help="leave the published records Kafka no longer holds (retention, "
                        "compaction, a partition gone) out of the scope: listed as not "
                        "compared, but the verdict is the rest's (exit 0 when it matches); "
                        "an aggregate's totals include them, so stay incomplete")
    verify.set_defaults(handler=cmd_verify)
