"""The one place that publishes a run: every table's rows, the dead letters, the ledger,
the offsets and the run row in ONE Postgres transaction, either all visible or none.

A run writes one table per route (driver/routing.py: the topics routed to it). The
transaction opens before Spark has finished reading: as each Spark task commits its staging
blobs, ``take()`` streams them into ``COPY <table> FROM STDIN`` on the publishing
connection, so Postgres parses and indexes the rows while the executors are still reading
(on 2 cores this hid most of a 5-7 s COPY of 2M rows; docs/benchmarks.md). A connection has
one COPY open at a time: the open one stays open for as long as the blobs are its table's
(a run of one table: one COPY statement for the whole run), and a blob of another table
ends it and opens that table's (each COPY statement its own binary signature and trailer).
Each table's rows go straight into it where its sink allows and its planned ranges hold no
row yet, else into a temp table of its own and through its sink's merge at ``finish()``.
Nothing of it is visible to anyone until ``finish()`` has compared-and-set the offsets and
committed; any error, signal or crash before that rolls everything back.

``finish()``, in this order (the one lock order of every publishing transaction): the last
blobs; each table's tombstones; the sinks' merge locks; per table in name order, its rows
merged (``_publish_table``); the dead-letter lock and the dead letters (one table for every
topic); the ledger; the offsets' compare-and-set; the run row; COMMIT.

An offset ends up in one place: a dead letter of an offset the run writes a row for moves
to pipeline_dead_letters_replayed in the same transaction (as a replay moves it), and a
record that fails again where a row already is gets no dead letter (invariant 8).

One attempt per Spark task (partition index) is used, chosen when the task is first seen,
and named by Spark's taskAttemptId (the attempt number restarts at 0 when Spark resubmits
a stage). A task attempt that committed and was then retried, or whose stage was
resubmitted, is never published or counted twice.

A transform's rows are checked before anything commits: one row per Kafka record, as the
results table is keyed by (topic, partition, offset); a second row for an offset is a
ConfigError naming the transform, never a conflict to retry or a row dropped in silence.
A transform writes one table (settings/routes.py).

With [sink] transactions (whole source transactions, driver/transaction_cut.py) every
table's rows go through its temp table, and ``finish(..., cut=)`` leaves out the rows,
tombstones and dead letters at or after each partition's cut before the merges; the ledger
records ``[from, cut)``, the offsets move to the cut (the transaction topic's to the END
events it passed) and the published source transactions are recorded, all in the same
transaction.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from typing import Any

import psycopg
from psycopg import sql
from sqlalchemy.schema import CreateTable

from pipeline import faults
from pipeline.driver.routing import RunTable
from pipeline.errors import ConfigError, PipelineError
from pipeline.executor.staging import (
    DEAD,
    HASH,
    RECEIVED,
    ROW,
    SEGMENTS,
    TOMBSTONE,
    reader_part,
)
from pipeline.formats.wire import binary as copy_binary
from pipeline.plan.offsets import OffsetRange, PlannedPartition
from pipeline.sinks import Merged, Sink
from pipeline.store import Store, tables
from pipeline.store.copy_in import copy_statement
from pipeline.store.database import db_errors
from pipeline.store.identifiers import identifiers
from pipeline.store.results import Results
from pipeline.store.run import Run

log = logging.getLogger("pipeline")

_DEAD = "_publish_dead"  # temp table of the run's dead letters, dropped at COMMIT
_ROWS = "_publish_rows"  # a table's temp table: _ROWS + "_" + its name, dropped at COMMIT
# What a cut run leaves out of a partition's staged lines: at or after its cut, and the
# offset runs (first, last) of changes written again (TransactionCut.replays).
_LEFT_OUT = ('DELETE FROM {} WHERE topic = %s AND "partition" = %s AND ("offset" >= %s OR '
             "EXISTS (SELECT FROM unnest(%s::bigint[], %s::bigint[]) AS r(lo, hi) "
             'WHERE "offset" BETWEEN r.lo AND r.hi))')


def _left_out_args(topic: str, partition: int, until: int,
                   runs: Sequence[tuple[int, int]]) -> tuple:
    return (topic, partition, until, [a for a, _ in runs], [b for _, b in runs])


# Staged blobs fetched a round trip at a time: a blob is a writer's batch (~1-2 MB of
# 10,000 rows), held twice while it is copied (libpq's result and Python's bytes), so four
# a fetch swung the driver's RSS by ~20 MB at the run's peak, one by ~7 (docs/benchmarks.md,
# "round four"); the ~200 extra fetches of 2M rows cost no CPU that shows.
BLOBS_PER_FETCH = 1
# The results key in a unique violation's detail: Kafka topic names hold no ", ".
_KEY_DETAIL = re.compile(r'^Key \(topic, "?partition"?, "?offset"?\)=\((.+), (\d+), (\d+)\)')


@dataclass(frozen=True)
class Published:
    """What a committed run published (Publisher.finish)."""

    records_read: int
    rows_written: int
    rows_deleted: int  # an upsert sink's tombstones
    dead_letters: int
    per_partition: dict[str, dict[str, int]] = field(default_factory=dict)
    timings: dict[str, float] = field(default_factory=dict)  # as stored in the run row
    # Per table: its mode, topics, records read, rows written and deleted, dead letters.
    tables: dict[str, dict[str, Any]] = field(default_factory=dict)
    # [sink] transactions: the cut (transaction_cut.RunCut.summary); empty without.
    transactions: dict[str, Any] = field(default_factory=dict)

    def counts(self) -> dict[str, Any]:
        """The counts, by name (job.RunResult's fields): all but the stored timings."""
        return {k: v for k, v in asdict(self).items() if k != "timings"}


@dataclass(eq=False)
class Target:
    """One table of the run's transaction: its sink, the topics routed to it, the run's
    ranges of them, and how its rows land (straight in, or through its temp table)."""

    sink: Sink
    topics: frozenset[str]
    ranges: list[OffsetRange]
    binary: bool | None  # the staged rows' COPY wire (None: a transform's, chosen later)
    results: Results
    direct: bool = False
    copied: int = 0  # rows its COPY statements wrote
    merged: Merged | None = None

    @property
    def name(self) -> str:
        return self.sink.settings.table

    @property
    def temp(self) -> str:
        """Its temp table (a table name has at most 48 characters: this fits Postgres's 63)."""
        return f"{_ROWS}_{self.name}"

    @property
    def into(self) -> sql.Composable:
        """Where its COPY writes: the table itself, or its temp table."""
        return self.sink.t(self.name) if self.direct else sql.Identifier(self.temp)

    @property
    def cols(self) -> sql.Composable:
        return identifiers(c.name for c in tables.written(self.sink.records))

    def counts(self, staged: dict[tuple[str, int], dict[str, int]]) -> dict[str, Any]:
        mine = [v for (topic, _), v in staged.items() if topic in self.topics]
        merged = self.merged or Merged(self.copied)
        return {"mode": self.sink.mode, "topics": sorted(self.topics),
                "records_read": sum(sum(v.values()) for v in mine),
                "rows_written": merged.rows, "rows_deleted": merged.deleted,
                "dead_letters": sum(v.get("dead", 0) for v in mine),
                "copied_directly": self.direct}


class Publisher:
    """``with Publisher(...) as pub: pub.take() ...; pub.staged(); pub.finish(...)``:
    finish() commits; leaving the context without it, or with an error, rolls back."""

    def __init__(self, store: Store, tables_: Sequence[RunTable], run: Run,
                 ranges: Sequence[OffsetRange], whole_transactions: bool = False):
        """``tables_``: the tables the run's ranges go to (routing.RunRoutes.reading), each
        with its sink and topics; a table's staged rows are in its route's COPY wire
        (RunTable.binary), or for a transform's run (one table) in the one its driver
        tells ``choose_wire`` once the transform's plan is built, before any blob is staged
        (the COPY then opens when the first blobs are taken). ``whole_transactions``: the
        run is cut at source transactions (finish's ``cut``): no row goes straight in."""
        self.store, self.run = store, run
        self.whole_transactions = whole_transactions
        # finish's cut: per partition cut short or with changes written again, (its cut,
        # the offset runs of those changes) - what _leave_out deletes
        self._left_out: dict[tuple[str, int], tuple[int, tuple[tuple[int, int], ...]]] = {}
        self.ranges = list(ranges)
        self.targets = [Target(t.sink, frozenset(t.topics),
                               [r for r in self.ranges if r.topic in t.topics], t.binary,
                               store.results(t.sink))
                        for t in sorted(tables_, key=lambda t: t.name)]
        self._by_topic = {topic: t for t in self.targets for topic in t.topics}
        self.transform = next((t.sink.settings.transform for t in self.targets
                               if t.sink.settings.transform), None)
        self.parts: dict[int, int] = {}  # Spark partition -> the task attempt published
        self.readers = 0  # a transform's read tasks, staged under staging.reader_part's parts
        self.staging = run.staging
        self.finished = False
        self.started = time.monotonic()
        self._dead_kept: dict[tuple[str, int], int] = {}  # a cut run's, per range cut short

    @property
    def tables(self) -> list[str]:
        return [t.name for t in self.targets]

    def __enter__(self) -> Publisher:
        store = self.store
        # A second connection reads the staged blobs: the publishing one is busy with COPY.
        with db_errors(store.url):
            self._reader = store.engine.connect()
            self._read = self._reader.connection.driver_connection  # psycopg: binary cursors
            with self._reader.begin():
                self._read.execute("SET application_name = 'kafka-offset-pipeline-publish'")
        self._copy_cm = self._copy = self._copying = None
        self._tx = store.transaction()
        self.conn = self._tx.__enter__()
        try:
            store.set_timeouts(self.conn)
            self._cur = self.conn.cursor()
            for t in self.targets:
                # A sink that may (append) copies straight into its keyed table when the
                # planned ranges hold no row yet (the usual case); otherwise the rows go
                # through a temp table and the sink's merge (pipeline/sinks/). Columns
                # sink.evolve adds are there already (driver/job.py added them before the
                # read).
                t.direct = (not self.whole_transactions and t.sink.copies_directly(self.run)
                            and not t.results.hold_rows_in(t.ranges))
                if not t.direct:
                    store.run(CreateTable(tables.record_batch(t.sink.settings, t.temp)))
        except BaseException as e:
            self.__exit__(type(e), e, e.__traceback__)
            raise
        return self

    # ---- the one COPY open on the publishing connection ---------------------------------
    def _copy_into(self, t: Target):
        """The open COPY into ``t``'s rows, in its staged rows' wire (binary tuples: the
        stream's signature and trailer are ours, the blobs are bare tuples; or text
        lines); another table's open COPY ends first."""
        if self._copying is not t:
            self._end_copy()
            cm = self._cur.copy(copy_statement(t.into, t.cols, t.binary))
            self._copy = cm.__enter__()
            self._copy_cm, self._copying = cm, t
            if t.binary:
                self._copy.write(copy_binary.SIGNATURE)
        return self._copy

    def _end_copy(self) -> None:
        """Ends the open COPY statement (its rows counted to its table's)."""
        t, cm = self._copying, self._copy_cm
        if t is None:
            return
        self._copy_cm = self._copying = None
        if t.binary:
            self._copy.write(copy_binary.TRAILER)
        with self._one_row_per_record():
            cm.__exit__(None, None, None)
        t.copied += self._cur.rowcount

    def choose_wire(self, binary: bool) -> None:
        """A transform's run (its one table's wire None): its writers stage COPY binary
        tuples, or text lines (executor/transform/arrow_binary.exact); called before its
        job starts."""
        if self._copying is not None or any(t.binary is not None for t in self.targets):
            raise RuntimeError("the publisher's COPY wire is chosen once, before any blob")
        for t in self.targets:
            t.binary = binary

    def __exit__(self, exc_type, exc, tb) -> None:
        unfinished = exc_type is None and not self.finished
        if unfinished:  # a bug in the caller: never commit a half-published run
            exc = RuntimeError("publisher left without finish(); rolled back")
            exc_type, tb = RuntimeError, None
        try:
            if self._copy_cm is not None:  # an error before finish(): abort the COPY
                try:
                    self._copy_cm.__exit__(exc_type, exc, tb)
                except Exception:  # noqa: BLE001 - rolled back below either way
                    pass
        finally:
            self._reader.close()  # back to the Store's pool
            if not self.finished:
                self._tx.__exit__(exc_type, exc, tb)  # rolls back when exc is set
        if unfinished:
            raise exc

    # ---- while Spark reads --------------------------------------------------------------
    def expect_readers(self, tasks: int) -> None:
        """A transform's run: ``tasks`` read tasks each stage their dead letters and range
        summaries under the part executor/staging.reader_part names (0: none)."""
        self.readers = tasks

    def take(self) -> int:
        """Stream the result blobs of tasks that committed since the last call; returns
        how many tasks were new."""
        with db_errors(self.store.url), self._reader.begin():
            visible = self._read.execute(sql.SQL(
                "SELECT part, min(task) FROM {} GROUP BY part").format(self.staging)
            ).fetchall()
            new = {p: t for p, t in visible if p not in self.parts}
            if new and self.targets:
                with db_errors(self.store.url), self._one_row_per_record():
                    self._stream_rows(new)
        self.parts.update(new)
        return len(new)

    def _stream_rows(self, parts: dict[int, int]) -> None:
        """The chosen attempts' result blobs into their tables' COPY, one blob at a time,
        table by table: the table whose COPY is open first (a run of one table keeps one
        COPY open for the whole run), then by name."""
        for t in sorted(self.targets, key=lambda t: (t is not self._copying, t.name)):
            if t.binary is None:  # a transform's run that staged no row yet
                continue
            for blob in self._blobs(ROW, parts, t.topics if len(self.targets) > 1 else None):
                self._copy_into(t).write(blob)

    def _blobs(self, kind: str, parts: dict[int, int],
               topics: frozenset[str] | None = None) -> Iterator[bytes]:
        """The chosen attempts' blobs of one kind (of ``topics`` only, if given), one at a
        time (read on the second connection: the publishing one is busy with a COPY)."""
        where = sql.SQL(" AND topic = ANY(%s)") if topics is not None else sql.SQL("")
        with self._read.cursor(name=f"blobs_{kind}") as cur:
            cur.itersize = BLOBS_PER_FETCH
            cur.execute(sql.SQL(
                "SELECT blob FROM {} WHERE kind = %s{} AND (part, task) IN (SELECT * FROM "
                "unnest(%s::int[], %s::bigint[])) ORDER BY part, seq").format(
                    self.staging, where),
                (kind, *([sorted(topics)] if topics is not None else []), list(parts),
                 list(parts.values())), binary=True)  # bytea, no hex
            for (blob,) in cur:
                yield blob

    def segments(self):
        """The chosen attempts' summaries by source transaction (store/segments.py), per
        partition; every task committed so far is taken first, and the open COPY ended
        (the cut reads the stored offsets on the publishing connection, in its
        transaction)."""
        from pipeline.store.segments import staged_ranges

        self.take()
        with db_errors(self.store.url):
            self._end_copy()
        with db_errors(self.store.url), self._reader.begin():
            return staged_ranges(self._read, self.staging, self.parts)

    def staged(self) -> dict[tuple[str, int], dict[str, int]]:
        """Per (topic, partition): result rows, dead letters and (upsert) tombstones of the
        published attempts, from the staging table's per-blob counts (no blob is read)."""
        out: dict[tuple[str, int], dict[str, int]] = {}
        with db_errors(self.store.url), self._reader.begin():
            for topic, partition, kind, n in self._read.execute(sql.SQL(
                    'SELECT topic, "partition", kind, sum(n) FROM {} WHERE kind <> ALL(%s) '
                    "AND (part, task) IN (SELECT * FROM unnest(%s::int[], %s::bigint[])) "
                    "GROUP BY 1, 2, 3 "
                    "ORDER BY 1, 2, 3").format(self.staging),
                    ([HASH, RECEIVED, SEGMENTS], list(self.parts), list(self.parts.values()))
            ).fetchall():
                item = out.setdefault((topic, partition), {"rows": 0, "dead": 0})
                name = {ROW: "rows", DEAD: "dead", TOMBSTONE: "deletes"}[kind]
                item[name] = item.get(name, 0) + int(n)
        return out

    def read_counts(self, kind: str = HASH) -> dict[tuple[str, int], int]:
        """Per (topic, partition): the Kafka records the published attempts read, from
        their range summaries (HASH blobs; a transform may filter some out, so its rows
        and dead letters do not count them); with ``kind`` RECEIVED, the rows a
        transform's writers received (its output)."""
        with db_errors(self.store.url), self._reader.begin():
            return {(t, p): int(n) for t, p, n in self._read.execute(sql.SQL(
                'SELECT topic, "partition", sum(n) FROM {} WHERE kind = %s AND (part, task) '
                "IN (SELECT * FROM unnest(%s::int[], %s::bigint[])) GROUP BY 1, 2").format(
                    self.staging), (kind, list(self.parts), list(self.parts.values()))
            ).fetchall()}

    def _check_no_row_lost(self, staged: dict[tuple[str, int], dict[str, int]]) -> None:
        """A transform's run: every row its writers received (the transform's output) was
        staged by the same attempt. A row lost on the way (a writer's bug) would otherwise
        count as ``filtered`` (records read less rows and dead letters) and commit."""
        received = self.read_counts(RECEIVED)
        for tp in sorted(set(received) | {tp for tp, v in staged.items() if v.get("rows")}):
            got, rows = received.get(tp, 0), staged.get(tp, {}).get("rows", 0)
            if got != rows:
                what = (f"lost {got - rows} of the {got} rows" if rows < got else
                        f"staged {rows - got} rows more than the {got}")
                raise PipelineError(
                    f"run {self.run.id}: the transform's writers received {got} rows of "
                    f"{tp[0]}[{tp[1]}] and staged {rows}: {what} of {tp[0]}[{tp[1]}]; "
                    "rolled back, nothing committed - a bug: rerun with -v and report it")

    def records_read(self, staged: dict[tuple[str, int], dict[str, int]]) -> int:
        """All records the published attempts read: a transform's from the read tasks'
        summaries, the built-in sinks' from their rows, dead letters and tombstones."""
        if self.readers:
            return sum(self.read_counts().values())
        return sum(sum(v.values()) for v in staged.values())

    def _check_readers(self) -> None:
        """Every read task of a transform's run committed once: else the transform did not
        read its input to the end (a limit, a take), and the ledger would miss ranges."""
        missing = [i for i in range(self.readers) if reader_part(i) not in self.parts]
        if missing:
            raise ConfigError(
                f"[sink] transform {self.transform!r} did not read all of its input: "
                f"{len(missing)} of {self.readers} read tasks were never read to their end "
                "(a limit(), take() or sample of the input?); a transform must read every "
                "record it is given (filter rows instead of limiting them), then rerun; "
                f"run {self.run.id} rolled back, nothing committed")

    # ---- after Spark: the rest of the transaction ---------------------------------------
    def finish(self, offset_updates: Sequence[PlannedPartition], timings: dict,
               topic_ids: dict[str, str] | None = None, cut=None) -> Published:
        """Everything after the read: the last blobs, each table's tombstones and merge
        (``_publish_table``, tables by name), the dead letters (those of offsets that are
        rows now moved out, the run's own written), the ledger rows, the offsets
        compare-and-set and the run row, then COMMIT. A transform's records that it
        filtered out are staged nowhere: ``filtered`` in the run's per-partition counts and
        its ledger rows. ``cut`` (transaction_cut.RunCut): what lies at or after each
        partition's cut is left out (``offset_updates`` are the cut's, RunCut.offset_updates)."""
        store, conn, run = self.store, self.conn, self.run
        if cut is not None and not self.whole_transactions:
            raise RuntimeError("a cut run's publisher is made with whole_transactions")
        short = cut.cut_short() if cut is not None else {}
        self._left_out = {tp: (r.until_offset, ()) for tp, r in short.items()}
        if cut is not None:  # changes Kafka Connect wrote again: never applied again
            for tp, runs in cut.cut.replays.items():
                self._left_out[tp] = (cut.cut.until[tp], runs)
        tail_started = time.monotonic()
        self.take()
        self._check_readers()
        staged = self.staged()
        if self.readers:
            self._check_no_row_lost(staged)
        with db_errors(store.url):
            self._end_copy()
            for t in self.targets:
                if any(v.get("deletes") for (topic, _), v in staged.items()
                       if topic in t.topics):
                    self._tombstones(t)
            kept = self._leave_out()
            # The one lock order of every publishing transaction: the sinks' merge locks
            # (tables by name), each table's rows, the dead-letter lock, the dead letters
            # (store/dead_letters.py).
            for t in self.targets:
                t.sink.lock_merges(conn)
            for t in self.targets:
                self._publish_table(t)
            rows_written = sum(t.counts(staged)["rows_written"] for t in self.targets)
            rows_deleted = sum(t.counts(staged)["rows_deleted"] for t in self.targets)
            dead_written = self._dead_letters(sum(v["dead"] for v in staged.values()))
            for tp in self._left_out:  # the counts of what is published of such a range
                runs = self._left_out[tp][1]
                replayed = sum(b - a + 1 for a, b in runs)
                staged[tp] = {**kept.get(tp, {"rows": 0}), "dead": self._dead_kept.get(tp, 0),
                              **({"replayed": replayed} if replayed else {})}
            by_table = {t.name: t.counts(staged) for t in self.targets}
            records_read = sum(sum(v.values()) for v in staged.values())
            if self.readers:
                read = self.read_counts()
                for tp, n in read.items():
                    item = staged.setdefault(tp, {"rows": 0, "dead": 0})
                    if (filtered := n - item["rows"] - item["dead"]) > 0:
                        item["filtered"] = filtered
                records_read = sum(read.values())
                for t in self.targets:  # a transform's one table
                    t_read = sum(n for (topic, _), n in read.items() if topic in t.topics)
                    by_table[t.name]["records_read"] = t_read
            per_partition = {f"{t}[{p}]": dict(v) for (t, p), v in sorted(staged.items())}
            # The ledger, from the same attempts (a transform's: the read tasks' summaries,
            # the writers' rows inside each range).
            store.ledger.record(run, self.parts, transformed=bool(self.readers))
            details: dict[str, Any] = {"tables": by_table}
            if cut is not None:
                store.ledger.cut_short(run, {
                    r: (*cut.ledger_at(tp), staged[tp]["rows"], staged[tp]["dead"],
                        staged[tp].get("deletes", 0)) for tp, r in short.items()})
                if cut.metadata.topic_id:
                    topic_ids = {**(topic_ids or {}), cut.metadata.topic: cut.metadata.topic_id}
                store.source_transactions.record(run, cut.cut.published)
                store.source_transactions.prune()
                details["transactions"] = cut.summary()
            store.offsets.compare_and_set(run, offset_updates, topic_ids)
            faults.inject("before_commit")
            # The stored timings include this transaction up to its COMMIT.
            publish = round(time.monotonic() - tail_started, 3)
            timings = {**timings, "publish": publish,
                       "total": round(timings.get("total", 0) + publish, 3)}
            store.runs.succeed(run, records_read=records_read, rows_written=rows_written,
                               dead_letters=dead_written, per_partition=per_partition,
                               timings=timings, rows_deleted=rows_deleted,
                               details=details)
            store.staging.drop(run)
        self.finished = True
        self._tx.__exit__(None, None, None)  # COMMIT: from here on, the run is published
        return Published(records_read, rows_written, rows_deleted, dead_written,
                         per_partition, timings, by_table, details.get("transactions", {}))

    def _leave_out(self) -> dict[tuple[str, int], dict[str, int]]:
        """A cut run: each table's rows and tombstones at or after its partitions' cut,
        and those of changes written again (``_left_out``), deleted from its temp table;
        per such partition, the rows and tombstones kept (the counts of its published
        part)."""
        kept: dict[tuple[str, int], dict[str, int]] = {}
        for t in self.targets:
            mine = [(tp, v) for tp, v in self._left_out.items() if tp[0] in t.topics]
            tombstone = (sql.SQL("_tombstone") if t.sink.settings.mode == "upsert"
                         else sql.SQL("false"))
            for (topic, partition), (until, runs) in mine:
                self.conn.execute(sql.SQL(_LEFT_OUT).format(sql.Identifier(t.temp)),
                                  _left_out_args(topic, partition, until, runs))
                rows, deletes = self.conn.execute(sql.SQL(
                    "SELECT count(*) FILTER (WHERE NOT {0}), count(*) FILTER (WHERE {0}) "
                    'FROM {1} WHERE topic = %s AND "partition" = %s').format(
                        tombstone, sql.Identifier(t.temp)), (topic, partition)).fetchone()
                kept[(topic, partition)] = {"rows": rows, **({"deletes": deletes}
                                                             if deletes else {})}
        return kept

    def _publish_table(self, t: Target) -> None:
        """One table's part of the transaction, under the merge locks: its rows are in its
        temp table (or, copied directly, in the table already); a reprocess clears what its
        ranges held; then its sink's merge."""
        if self.run.overwrite:
            t.results.clear(t.ranges)
        if t.direct:
            return
        self._check_one_row_per_record(t)
        t.merged = t.sink.merge(self.conn, t.temp, self.run)

    # ---- a transform's rows: one per Kafka record -------------------------------------
    def _two_rows(self, t: Target, topic: str, partition: int, offset: int,
                  rows: str) -> ConfigError:
        return ConfigError(
            f"[sink] transform {self.transform!r} returned {rows} for the record "
            f"{topic}[{partition}] offset {offset}; the results table {t.name} holds "
            "one row per Kafka record (keyed by topic, partition, offset): make the transform "
            "return at most one row per input row (keep several values in an array column), "
            f"then rerun; run {self.run.id} rolled back, nothing committed")

    def _check_one_row_per_record(self, t: Target) -> None:
        """Before the merge: a transform's second row for an offset would be dropped by
        ON CONFLICT DO NOTHING (or fail a reprocess's DO UPDATE) instead of being named, and
        a null key would fail the merge without naming the record."""
        if not self.transform:
            return  # the built-in sinks write one line per record
        found = self.conn.execute(sql.SQL(
            'SELECT topic, "partition", "offset", count(*) FROM {} GROUP BY 1, 2, 3 '
            "HAVING count(*) > 1 ORDER BY 1, 2, 3 LIMIT 1").format(
                sql.Identifier(t.temp))).fetchone()
        if found:
            raise self._two_rows(t, found[0], found[1], found[2], f"{found[3]} rows")
        key = t.sink.settings.key
        if not key:
            return
        # An upsert key or aggregate group_by the transform made null: no row can hold it.
        null = self.conn.execute(sql.SQL(
            'SELECT topic, "partition", "offset" FROM {} WHERE {} ORDER BY 1, 2, 3 LIMIT 1'
        ).format(sql.Identifier(t.temp), sql.SQL(" OR ").join(
            sql.SQL("{} IS NULL").format(sql.Identifier(k)) for k in key))
        ).fetchone()
        if null:
            raise ConfigError(
                f"[sink] transform {self.transform!r} returned a null "
                f"{'/'.join(key)} (the sink's key) for the record {null[0]}"
                f"[{null[1]}] offset {null[2]}; make the transform keep a value there (or "
                f"filter the row out), then rerun; run {self.run.id} rolled back, nothing "
                "committed")

    @contextmanager
    def _one_row_per_record(self) -> Iterator[None]:
        """Around a direct COPY into a results table: its key refuses a second row for an
        offset. If the offset is not among the committed rows, the two rows are this run's
        own (a transform's); else another run published it first (ConflictError)."""
        try:
            yield
        except psycopg.errors.UniqueViolation as e:
            key = _KEY_DETAIL.match(e.diag.message_detail or "")
            t = next((t for t in self.targets if t.direct
                      and e.diag.table_name == t.sink.results.name), None)
            if not (self.transform and t is not None and key):
                raise
            topic, partition, offset = key[1], int(key[2]), int(key[3])
            # take() reads inside its own transaction on the reader; finish() outside one.
            with nullcontext() if self._reader.in_transaction() else self._reader.begin():
                committed = self._read.execute(sql.SQL(
                    'SELECT 1 FROM {} WHERE topic = %s AND "partition" = %s AND "offset" = %s'
                ).format(self.store.t(t.sink.results.name)),
                    (topic, partition, offset)).fetchone()
            if committed:
                raise
            raise self._two_rows(t, topic, partition, offset, "more than one row") from None

    def _tombstones(self, t: Target) -> None:
        """An upsert table's tombstones (of its topics), into its temp table (flagged
        _tombstone)."""
        cols = identifiers(tables.tombstone_columns(t.sink.settings))
        with self.conn.cursor() as cur, cur.copy(copy_statement(
                sql.Identifier(t.temp), cols)) as cp, self._reader.begin():
            for blob in self._blobs(TOMBSTONE, self.parts, t.topics):
                cp.write(blob)

    def _dead_letters(self, staged_dead: int) -> int:
        """Under the dead-letter lock: the dead letters of offsets that are rows now move to
        pipeline_dead_letters_replayed (a backfill or reprocess after a fix of the config, as
        a replay would); a reprocess clears the rest of its ranges'; then the run's own
        dead letters (every table's topics': one dead-letter table), never beside a row.
        Returns how many the run wrote."""
        store, conn, run = self.store, self.conn, self.run
        dead = store.dead_letters
        sinks = [t.sink for t in self.targets]
        dead.lock(conn)
        if dead.in_ranges(self.ranges):
            rows = sql.SQL(" UNION ALL ").join(
                sql.SQL('SELECT topic, "partition", "offset" FROM {}').format(t.into)
                for t in self.targets)
            if self.targets and (moved := dead.move_of_rows(run.id, rows, self.ranges)):
                store.runs.add_details(run.id, {"dead_letters_replayed": moved})
                log.info("run %s: %d dead letters of its ranges are rows now; moved to "
                         "pipeline_dead_letters_replayed", run.id, moved,
                         extra={"event": "publish.dead_letters_replayed", "run_id": run.id,
                                "moved": moved})
            if run.overwrite:
                dead.clear(self.ranges)
        if not staged_dead:
            return 0
        store.run(CreateTable(tables.dead_letter_batch(_DEAD)))
        fields = identifiers(c.name for c in tables.DEAD_LETTER_FIELDS)
        with conn.cursor() as cur, cur.copy(copy_statement(
                sql.Identifier(_DEAD), fields)) as cp, self._reader.begin():
            for blob in self._blobs(DEAD, self.parts):
                cp.write(blob)
        for (topic, partition), (until, runs) in self._left_out.items():  # a cut run's
            conn.execute(sql.SQL(_LEFT_OUT).format(sql.Identifier(_DEAD)),
                         _left_out_args(topic, partition, until, runs))
            self._dead_kept[(topic, partition)] = conn.execute(sql.SQL(
                'SELECT count(*) FROM {} WHERE topic = %s AND "partition" = %s').format(
                    sql.Identifier(_DEAD)), (topic, partition)).fetchone()[0]
        kept, first = dead.beside_rows(_DEAD, sinks)
        if kept:
            store.runs.add_details(run.id, {"rows_kept_over_dead_letters": kept})
            log.warning(
                "run %s: %d records failed again but their offsets already have result rows "
                "(first: %s); the rows are kept and no dead letter is written - an offset is "
                "a row or a dead letter, never both ('pipeline backfill --reprocess' replaces "
                "the rows)", run.id, kept,
                ", ".join(f"{t}[{p}]@{o}" for t, p, o in first),
                extra={"event": "publish.rows_kept", "run_id": run.id, "kept": kept})
        return conn.execute(dead.merge_sql(_DEAD, run.overwrite, sinks),
                            (store.pipeline, run.id)).rowcount
