"""The one place that publishes a run: results, dead letters, offsets and the run row in ONE
Postgres transaction, either all visible or none.

The transaction opens before Spark has finished reading: as each Spark task commits its
staging blobs, ``take()`` streams them into ``COPY results FROM STDIN`` on the publishing
connection, so Postgres parses and indexes the rows while the executors are still reading
(on 2 cores this hid most of a 5-7 s COPY of 2M rows; docs/benchmarks.md). Nothing of it is
visible to anyone until ``finish()`` has compared-and-set the offsets and committed; any
error, signal or crash before that rolls everything back.

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
from pipeline.errors import ConfigError, PipelineError
from pipeline.executor.staging import DEAD, HASH, RECEIVED, ROW, TOMBSTONE, reader_part
from pipeline.formats.wire import binary as copy_binary
from pipeline.plan.offsets import OffsetRange, PlannedPartition
from pipeline.sinks import Sink
from pipeline.store import Store, tables
from pipeline.store.copy_in import copy_statement
from pipeline.store.database import db_errors
from pipeline.store.identifiers import identifiers
from pipeline.store.run import Run

log = logging.getLogger("pipeline")

_ROWS, _DEAD = "_publish_rows", "_publish_dead"  # temp tables, dropped at COMMIT
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

    def counts(self) -> dict[str, Any]:
        """The counts, by name (job.RunResult's fields): all but the stored timings."""
        return {k: v for k, v in asdict(self).items() if k != "timings"}


class Publisher:
    """``with Publisher(...) as pub: pub.take() ...; pub.staged(); pub.finish(...)``:
    finish() commits; leaving the context without it, or with an error, rolls back."""

    def __init__(self, store: Store, sink: Sink, run: Run, ranges: Sequence[OffsetRange],
                 binary: bool | None = False):
        """``sink``: the results table's (the run's rows land through its merge).
        ``binary``: the staged result blobs are COPY binary tuples (registry.binary_rows),
        else COPY text lines; None: a transform's run, whose driver says which with
        ``choose_wire`` once the transform's plan is built, before any blob is staged
        (the COPY then opens when the first blobs are taken)."""
        self.store, self.run, self.binary = store, run, binary
        self.sink, self.results = sink, store.results(sink)
        self.settings = sink.settings  # [sink]
        self.ranges = list(ranges)
        self.parts: dict[int, int] = {}  # Spark partition -> the task attempt published
        self.readers = 0  # a transform's read tasks, staged under staging.reader_part's parts
        self.staging = run.staging
        self.cols = identifiers(c.name for c in tables.written(sink.records))
        self.finished = False
        self.started = time.monotonic()

    def __enter__(self) -> Publisher:
        store = self.store
        # A second connection reads the staged blobs: the publishing one is busy with COPY.
        with db_errors(store.url):
            self._reader = store.engine.connect()
            self._read = self._reader.connection.driver_connection  # psycopg: binary cursors
            with self._reader.begin():
                self._read.execute("SET application_name = 'kafka-offset-pipeline-publish'")
        self._copy_cm = None
        self._tx = store.transaction()
        self.conn = self._tx.__enter__()
        try:
            store.set_timeouts(self.conn)
            # A sink that may (append) copies straight into its keyed table when the planned
            # ranges hold no row yet (the usual case); otherwise the rows go through a temp
            # table and the sink's merge (pipeline/sinks/). Columns sink.evolve adds are
            # there already (driver/job.py added them before the read).
            self.direct = (self.sink.copies_directly(self.run)
                           and not self.results.hold_rows_in(self.ranges))
            target = (store.t(self.sink.results.name) if self.direct
                      else sql.Identifier(_ROWS))
            if not self.direct:
                store.run(CreateTable(tables.record_batch(self.settings, _ROWS)))
            self._target = target
            self._cur = self.conn.cursor()
            if self.binary is not None:
                self._open_copy()
        except BaseException as e:
            self.__exit__(type(e), e, e.__traceback__)
            raise
        return self

    def _open_copy(self):
        """The results' COPY, in the staged rows' wire: binary tuples (then the stream's
        signature and trailer are ours: the blobs are bare tuples) or text lines."""
        if self._copy_cm is None:
            cm = self._cur.copy(copy_statement(self._target, self.cols, self.binary))
            self._copy = cm.__enter__()
            self._copy_cm = cm
            if self.binary:
                self._copy.write(copy_binary.SIGNATURE)
        return self._copy

    def choose_wire(self, binary: bool) -> None:
        """A transform's run (``binary=None``): its writers stage COPY binary tuples, or
        text lines (executor/transform/arrow_binary.exact); called before its job starts."""
        if self._copy_cm is not None or self.binary is not None:
            raise RuntimeError("the publisher's COPY wire is chosen once, before any blob")
        self.binary = binary

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
            if new:
                with db_errors(self.store.url), self._one_row_per_record():
                    self._stream(ROW, new, self._open_copy())
        self.parts.update(new)
        return len(new)

    def _stream(self, kind: str, parts: dict[int, int], copy) -> None:
        """Feed the chosen attempts' blobs of one kind into an open COPY, one blob at a time
        (read on the second connection: the publishing one is busy with the COPY)."""
        with self._read.cursor(name=f"blobs_{kind}") as cur:
            cur.itersize = BLOBS_PER_FETCH
            cur.execute(sql.SQL(
                "SELECT blob FROM {} WHERE kind = %s AND (part, task) IN (SELECT * FROM "
                "unnest(%s::int[], %s::bigint[])) ORDER BY part, seq").format(self.staging),
                (kind, list(parts), list(parts.values())), binary=True)  # bytea, no hex
            for (blob,) in cur:
                copy.write(blob)

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
                    ([HASH, RECEIVED], list(self.parts), list(self.parts.values()))
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
                f"[sink] transform {self.settings.transform!r} did not read all of its input: "
                f"{len(missing)} of {self.readers} read tasks were never read to their end "
                "(a limit(), take() or sample of the input?); a transform must read every "
                "record it is given (filter rows instead of limiting them), then rerun; "
                f"run {self.run.id} rolled back, nothing committed")

    # ---- after Spark: the rest of the transaction ---------------------------------------
    def finish(self, offset_updates: Sequence[PlannedPartition], timings: dict,
               topic_ids: dict[str, str] | None = None) -> Published:
        """Everything after the read: the last blobs, the merge if needed, the dead letters
        (those of offsets that are rows now moved out, the run's own written), the ledger
        rows, the offsets compare-and-set and the run row, then COMMIT. A transform's records
        that it filtered out are staged nowhere: ``filtered`` in the run's per-partition
        counts and its ledger rows."""
        store, conn, run = self.store, self.conn, self.run
        tail_started = time.monotonic()
        self.take()
        self._check_readers()
        staged = self.staged()
        if self.readers:
            self._check_no_row_lost(staged)
        with db_errors(store.url):
            if self.binary is None:  # a transform's run that staged nothing: no wire chosen
                self.binary = False
            self._open_copy()
            cm, self._copy_cm = self._copy_cm, None
            if self.binary:
                self._copy.write(copy_binary.TRAILER)
            with self._one_row_per_record():
                cm.__exit__(None, None, None)
            rows_written, rows_deleted = self._cur.rowcount, 0
            if any(v.get("deletes") for v in staged.values()):
                self._tombstones()
            # The one lock order of every publishing transaction: the sink's merge lock,
            # the results, the dead-letter lock, the dead letters (store/dead_letters.py).
            self.sink.lock_merges(conn)
            if run.overwrite:
                self.results.clear(self.ranges)
            if not self.direct:
                self._check_one_row_per_record()
                merged = self.sink.merge(conn, _ROWS, run)
                rows_written, rows_deleted = merged.rows, merged.deleted
            dead_written = self._dead_letters(sum(v["dead"] for v in staged.values()))
            records_read = sum(sum(v.values()) for v in staged.values())
            if self.readers:
                read = self.read_counts()
                for tp, n in read.items():
                    item = staged.setdefault(tp, {"rows": 0, "dead": 0})
                    if (filtered := n - item["rows"] - item["dead"]) > 0:
                        item["filtered"] = filtered
                records_read = sum(read.values())
            per_partition = {f"{t}[{p}]": dict(v) for (t, p), v in sorted(staged.items())}
            # The ledger, from the same attempts (a transform's: the read tasks' summaries,
            # the writers' rows inside each range).
            store.ledger.record(run, self.parts, transformed=bool(self.readers))
            store.offsets.compare_and_set(run, offset_updates, topic_ids)
            faults.inject("before_commit")
            # The stored timings include this transaction up to its COMMIT.
            publish = round(time.monotonic() - tail_started, 3)
            timings = {**timings, "publish": publish,
                       "total": round(timings.get("total", 0) + publish, 3)}
            store.runs.succeed(run, records_read=records_read, rows_written=rows_written,
                               dead_letters=dead_written, per_partition=per_partition,
                               timings=timings, rows_deleted=rows_deleted)
            store.staging.drop(run)
        self.finished = True
        self._tx.__exit__(None, None, None)  # COMMIT: from here on, the run is published
        return Published(records_read, rows_written, rows_deleted, dead_written,
                         per_partition, timings)

    # ---- a transform's rows: one per Kafka record -------------------------------------
    def _two_rows(self, topic: str, partition: int, offset: int, rows: str) -> ConfigError:
        return ConfigError(
            f"[sink] transform {self.settings.transform!r} returned {rows} for the record "
            f"{topic}[{partition}] offset {offset}; the results table {self.settings.table} holds "
            "one row per Kafka record (keyed by topic, partition, offset): make the transform "
            "return at most one row per input row (keep several values in an array column), "
            f"then rerun; run {self.run.id} rolled back, nothing committed")

    def _check_one_row_per_record(self) -> None:
        """Before the merge: a transform's second row for an offset would be dropped by
        ON CONFLICT DO NOTHING (or fail a reprocess's DO UPDATE) instead of being named, and
        a null key would fail the merge without naming the record."""
        if not self.settings.transform:
            return  # the built-in sinks write one line per record
        found = self.conn.execute(sql.SQL(
            'SELECT topic, "partition", "offset", count(*) FROM {} GROUP BY 1, 2, 3 '
            "HAVING count(*) > 1 ORDER BY 1, 2, 3 LIMIT 1").format(
                sql.Identifier(_ROWS))).fetchone()
        if found:
            raise self._two_rows(found[0], found[1], found[2], f"{found[3]} rows")
        if not self.settings.key:
            return
        # An upsert key or aggregate group_by the transform made null: no row can hold it.
        null = self.conn.execute(sql.SQL(
            'SELECT topic, "partition", "offset" FROM {} WHERE {} ORDER BY 1, 2, 3 LIMIT 1'
        ).format(sql.Identifier(_ROWS), sql.SQL(" OR ").join(
            sql.SQL("{} IS NULL").format(sql.Identifier(k)) for k in self.settings.key))
        ).fetchone()
        if null:
            raise ConfigError(
                f"[sink] transform {self.settings.transform!r} returned a null "
                f"{'/'.join(self.settings.key)} (the sink's key) for the record {null[0]}"
                f"[{null[1]}] offset {null[2]}; make the transform keep a value there (or "
                f"filter the row out), then rerun; run {self.run.id} rolled back, nothing "
                "committed")

    @contextmanager
    def _one_row_per_record(self) -> Iterator[None]:
        """Around the direct COPY into the results table: its key refuses a second row for
        an offset. If the offset is not among the committed rows, the two rows are this
        run's own (a transform's); else another run published it first (ConflictError)."""
        try:
            yield
        except psycopg.errors.UniqueViolation as e:
            key = _KEY_DETAIL.match(e.diag.message_detail or "")
            if not (self.settings.transform and self.direct and key
                    and e.diag.table_name == self.sink.results.name):
                raise
            topic, partition, offset = key[1], int(key[2]), int(key[3])
            # take() reads inside its own transaction on the reader; finish() outside one.
            with nullcontext() if self._reader.in_transaction() else self._reader.begin():
                committed = self._read.execute(sql.SQL(
                    'SELECT 1 FROM {} WHERE topic = %s AND "partition" = %s AND "offset" = %s'
                ).format(self.store.t(self.sink.results.name)),
                    (topic, partition, offset)).fetchone()
            if committed:
                raise
            raise self._two_rows(topic, partition, offset, "more than one row") from None

    def _tombstones(self) -> None:
        """An upsert sink's tombstones, into the rows' temp table (flagged _tombstone)."""
        cols = identifiers(tables.tombstone_columns(self.settings))
        with self.conn.cursor() as cur, cur.copy(copy_statement(
                sql.Identifier(_ROWS), cols)) as cp, self._reader.begin():
            self._stream(TOMBSTONE, self.parts, cp)

    def _dead_letters(self, staged_dead: int) -> int:
        """Under the dead-letter lock: the dead letters of offsets that are rows now move to
        pipeline_dead_letters_replayed (a backfill or reprocess after a fix of the config, as
        a replay would); a reprocess clears the rest of its ranges'; then the run's own
        dead letters, never beside a row. Returns how many the run wrote."""
        store, conn, run = self.store, self.conn, self.run
        dead = store.dead_letters
        dead.lock(conn)
        if dead.in_ranges(self.ranges):
            rows = (sql.SQL('SELECT topic, "partition", "offset" FROM {}').format(
                store.t(self.sink.results.name)) if self.direct else
                sql.SQL('SELECT topic, "partition", "offset" FROM {}').format(
                    sql.Identifier(_ROWS)))
            if moved := dead.move_of_rows(run.id, rows, self.ranges):
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
            self._stream(DEAD, self.parts, cp)
        kept, first = dead.beside_rows(_DEAD, [self.sink])
        if kept:
            store.runs.add_details(run.id, {"rows_kept_over_dead_letters": kept})
            log.warning(
                "run %s: %d records failed again but their offsets already have result rows "
                "(first: %s); the rows are kept and no dead letter is written - an offset is "
                "a row or a dead letter, never both ('pipeline backfill --reprocess' replaces "
                "the rows)", run.id, kept,
                ", ".join(f"{t}[{p}]@{o}" for t, p, o in first),
                extra={"event": "publish.rows_kept", "run_id": run.id, "kept": kept})
        return conn.execute(dead.merge_sql(_DEAD, run.overwrite, [self.sink]),
                            (store.pipeline, run.id)).rowcount
