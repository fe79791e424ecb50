"""upsert: per business key, the newest record by one total order (``order_key``, ``newer``),
the same within a run and across runs, for an ingest, a backfill and a reprocess alike, and
the same that ``pipeline verify`` recomputes the state by (``state_sql``); it replaces the
stored row only if it is newer, so a re-read of an old range (or of an old partition after
the topic grew) never overwrites newer state. Tombstones delete, and are kept in
``<table>_deleted`` so that an older record replayed later cannot bring the row back.

Debezium's change events (formats/debezium/) add two things, both placed by the same
order: a truncate (a tombstone line without a key) deletes every key it is newer than, and
a column an update left out (``_unavailable``) keeps the value the row had."""

from __future__ import annotations

import logging
from functools import cached_property

import psycopg
from psycopg import sql
from sqlalchemy import (
    BigInteger,
    Column,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    Table,
    Text,
    func,
)

from pipeline.errors import DataError
from pipeline.sinks.base import Merged, Sink
from pipeline.store import tables
from pipeline.store.identifiers import identifiers
from pipeline.store.run import Run
from pipeline.store.tables import UNAVAILABLE

log = logging.getLogger(__name__)

_LATEST = "_publish_latest"  # temp table: the run's newest record per key
_CANDIDATES = "_upsert_candidates"  # temp table: records that may hold an unavailable value
_REKEYED = "_upsert_rekeyed"  # temp table: primary-key changes' creates and their old keys
MERGE_LOCK_CLASS = 7_400_002  # advisory lock of the upsert merges (store.LOCK_CLASS + 1)
_COORDINATES = ("topic", "partition", "offset")
# The stored row's (and tombstone's) order time (``order_time``): a column of the pipeline's
# own, added to an older table by init-db; NULL there means its own Kafka timestamp.
ORDER_TIME = "_order_time"
# A Kafka timestamp from year 10000 on is no clock's (microseconds sent as milliseconds):
# it orders as none, so it cannot put its record ahead of every later one for ever.
_LAST_TIME = sql.SQL("'10000-01-01 00:00:00+00'::timestamptz")


def usable_time(t: str) -> sql.Composable:
    """Record ``t``'s Kafka timestamp as the order reads it: NULL from year 10000 on."""
    return sql.SQL("(CASE WHEN {t}.kafka_timestamp < {last} THEN {t}.kafka_timestamp END)"
                   ).format(t=sql.Identifier(t), last=_LAST_TIME)


def order_time(t: str) -> sql.Composable:
    """The order time of ``t`` (a row, a tombstone, a run's record with its ``_order_time``):
    the latest usable Kafka timestamp of its key's records in its partition up to it."""
    return sql.SQL("coalesce({t}.{o}, {own})").format(
        t=sql.Identifier(t), o=sql.Identifier(ORDER_TIME), own=usable_time(t))


def order_key(t: str) -> sql.Composable:
    """The total order of a key's records, as one row value: (order time, NULL oldest;
    partition; topic; offset). Within a partition the order time never decreases, so there
    the offsets decide; across partitions (a topic that grew, a pipeline of several topics)
    the later order time, then the higher partition, then the greater topic name."""
    return sql.SQL("(coalesce({ot}, '-infinity'), {t}.\"partition\", {t}.topic, {t}.\"offset\")"
                   ).format(ot=order_time(t), t=sql.Identifier(t))


def newer(incoming: str, stored: str) -> sql.Composable:
    """``incoming`` (a record) supersedes ``stored`` (the row or tombstone of its key): by
    ``order_key``, and within one partition by the offsets alone, whatever order times say
    (a record the pipeline never saw before its successor, a replayed dead letter, must not
    overtake it there). The one rule every statement here and in ``state_sql`` orders by
    (docs/reliability.md, "Upsert across partitions")."""
    i, s = sql.Identifier(incoming), sql.Identifier(stored)
    return sql.SQL(
        "(CASE WHEN {i}.topic = {s}.topic AND {i}.partition = {s}.partition "
        "THEN {i}.\"offset\" > {s}.\"offset\" ELSE {oi} > {os} END)").format(
        i=i, s=s, oi=order_key(incoming), os=order_key(stored))


def partitions_added(stored, kafka) -> dict[str, tuple[list[int], list[int]]]:
    """Topics that grew since the pipeline last stored offsets: topic -> (partitions
    stored, partitions Kafka has that are not). Only reported (job.py logs it): an upsert
    sink stays right without it, as ``newer`` orders a key's records across partitions."""
    known: dict[str, set[int]] = {}
    for topic, partition in stored:
        known.setdefault(topic, set()).add(partition)
    out: dict[str, tuple[list[int], list[int]]] = {}
    for k in kafka:
        if k.topic in known and k.partition not in known[k.topic]:
            out.setdefault(k.topic, (sorted(known[k.topic]), []))[1].append(k.partition)
    return {t: (had, sorted(new)) for t, (had, new) in out.items()}


class Upsert(Sink):
    mode = "upsert"

    @cached_property
    def results(self) -> Table:
        """The record rows' columns keyed by the business key; topic, partition and offset
        say which record the row is, ``_order_time`` its place in the order (``newer``)."""
        sink = self.settings
        return Table(
            sink.table, MetaData(schema=tables.SCHEMA),
            *[Column(c.name, c.type, nullable=c.name not in _COORDINATES and c.nullable,
                     server_default=c.server_default, autoincrement=False)
              for c in self.records.columns if c.name not in self._staged_only],
            _order_time_column(),
            PrimaryKeyConstraint(*sink.key, name=f"{sink.table}_pkey"))

    @property
    def _staged_only(self) -> set[str]:
        """A staged change event's columns the results table has no place for."""
        return {UNAVAILABLE, *(c.name for c in tables.old_key_columns(self.settings))}

    @cached_property
    def deleted(self) -> Table:
        """The tombstones that deleted (or would have deleted) a key: which record did, so
        that an older record of that key, replayed by a backfill, cannot bring the row
        back. A newer record of the key removes its tombstone."""
        sink = self.settings
        return Table(
            f"{sink.table}_deleted", MetaData(schema=tables.SCHEMA), *tables.business_key(sink),
            Column("topic", Text, nullable=False), Column("partition", Integer, nullable=False),
            Column("offset", BigInteger, nullable=False),
            Column("kafka_timestamp", tables.TIMESTAMPTZ),
            Column("run_id", BigInteger, nullable=False),
            Column("deleted_at", tables.TIMESTAMPTZ, nullable=False, server_default=func.now()),
            _order_time_column())

    @property
    def tables(self) -> list[Table]:
        return [self.results, self.deleted]

    def upgrades(self) -> list[sql.Composable]:
        return [sql.SQL("ALTER TABLE {} ADD COLUMN IF NOT EXISTS {} timestamptz").format(
            self.t(t.name), sql.Identifier(ORDER_TIME)) for t in self.tables]

    def archive_recreated(self, conn, topic, archive_results) -> int:
        rows = archive_results()
        # The old topic's tombstones go: their offsets are the old topic's, and would hide
        # the new topic's records.
        conn.execute(sql.SQL("DELETE FROM {} WHERE topic = %s").format(
            self.t(self.deleted.name)), (topic,))
        return rows

    # ---- the statements a merge and verify's recomputation share -----------------------
    @property
    def _debezium(self) -> bool:
        return self.settings.envelope == "debezium"

    def _on(self, a: str, b: str) -> sql.Composable:
        return sql.SQL(" AND ").join(
            sql.SQL("{a}.{k} = {b}.{k}").format(a=sql.Identifier(a), b=sql.Identifier(b),
                                                k=sql.Identifier(k)) for k in self.settings.key)

    def _keys(self, t: str) -> sql.Composable:
        return sql.SQL(", ").join(sql.SQL("{}.{}").format(sql.Identifier(t), sql.Identifier(k))
                                  for k in self.settings.key)

    def _truncates_sql(self, rows: sql.Identifier,
                       stored: sql.Composable | None) -> list[sql.Composable]:
        """A truncate (a tombstone line without a key) becomes a tombstone, at its place in
        the log, of every key ``rows`` or the table ``stored`` holds: the order then keeps
        each key's changes newer than it and deletes the rest, as for any tombstone."""
        key = identifiers(self.settings.key)
        first = sql.Identifier(self.settings.key[0])
        keys = sql.SQL("SELECT {key} FROM {rows} WHERE {first} IS NOT NULL").format(
            key=key, rows=rows, first=first)
        if stored is not None:
            keys = sql.SQL("{} UNION SELECT {} FROM {}").format(keys, key, stored)
        return [sql.SQL(
            "INSERT INTO {rows} ({key}, topic, \"partition\", \"offset\", kafka_timestamp, "
            "run_id, _tombstone) SELECT {kk}, t.topic, t.\"partition\", t.\"offset\", "
            "t.kafka_timestamp, t.run_id, true FROM ({keys}) AS k CROSS JOIN (SELECT * FROM "
            "{rows} WHERE _tombstone AND {first} IS NULL) AS t").format(
                rows=rows, key=key, kk=self._keys("k"), keys=keys, first=first),
            sql.SQL("DELETE FROM {} WHERE _tombstone AND {} IS NULL").format(rows, first)]

    def _newest_sql(self, rows: sql.Identifier, latest: sql.Identifier) -> sql.Composable:
        """Each key's newest record per partition of ``rows`` (the offsets order them there:
        one sort), with its order time: the latest usable Kafka timestamp of the key's
        records in that partition among ``rows``."""
        key = self._keys("s")
        return sql.SQL(
            "CREATE TEMP TABLE {latest} ON COMMIT DROP AS SELECT DISTINCT ON ({key}, s.topic, "
            "s.partition) s.*, max({ts}) OVER (PARTITION BY {key}, s.topic, s.partition ORDER "
            "BY s.\"offset\" DESC ROWS BETWEEN UNBOUNDED PRECEDING AND UNBOUNDED FOLLOWING) "
            "AS {o} FROM {rows} AS s ORDER BY {key}, s.topic, s.partition, s.\"offset\" DESC"
        ).format(latest=latest, key=key, ts=usable_time("s"), o=sql.Identifier(ORDER_TIME),
                 rows=rows)

    def _superseded_sql(self, latest: sql.Identifier) -> sql.Composable:
        """Of a key's newest records per partition, all but the one ``newer`` puts last."""
        return sql.SQL("DELETE FROM {s} AS o USING {s} AS l WHERE {on} AND {newer}").format(
            s=latest, on=self._on("o", "l"), newer=newer("l", "o"))

    def _fill_sql(self, latest: sql.Identifier, rows: sql.Identifier,
                  stored: tuple[sql.Composable, sql.Composable] | None,
                  columns: list[str] | None = None) -> list[sql.Composable]:
        """A change that left a column out (``_unavailable``; of ``columns``, else any
        non-key column) takes the value of the key's newest older change that has it (or
        NULL, past a deletion of the key): among ``rows``, ordered by ``order_key``, each
        with its order time as of itself. With ``stored`` (the results and deleted tables),
        only changes newer than what they hold count; what is still left out afterwards is
        the stored row's (the MERGE)."""
        key = self._keys("s")
        stored_time = sql.SQL("")
        bound = sql.SQL("")
        if stored is not None:
            res, gone = stored
            same = sql.SQL("{on} AND {x}.topic = s.topic AND {x}.partition = s.partition")
            stored_time = sql.SQL(", (SELECT {rt} FROM {res} AS r WHERE {r_on}), (SELECT {dt} "
                                  "FROM {gone} AS d WHERE {d_on})").format(
                rt=order_time("r"), dt=order_time("d"), res=res, gone=gone,
                r_on=same.format(on=self._on("r", "s"), x=sql.Identifier("r")),
                d_on=same.format(on=self._on("d", "s"), x=sql.Identifier("d")))
            bound = sql.SQL(
                " AND NOT EXISTS (SELECT FROM {res} AS r WHERE {r_on} AND NOT {fr}) AND NOT "
                "EXISTS (SELECT FROM {gone} AS d WHERE {d_on} AND NOT {fd})").format(
                res=res, gone=gone, r_on=self._on("r", "f"), d_on=self._on("d", "f"),
                fr=newer("f", "r"), fd=newer("f", "d"))
        candidates = sql.Identifier(_CANDIDATES)
        out = [sql.SQL(
            "CREATE TEMP TABLE {c} ON COMMIT DROP AS SELECT s.*, greatest(max({ts}) OVER "
            "(PARTITION BY {key}, s.topic, s.partition ORDER BY s.\"offset\"){stored}) AS {o} "
            "FROM {rows} AS s WHERE ({key}) IN (SELECT {lk} FROM {latest} AS l WHERE l.{u} IS "
            "NOT NULL)").format(c=candidates, ts=usable_time("s"), key=key, stored=stored_time,
                                o=sql.Identifier(ORDER_TIME), rows=rows, lk=self._keys("l"),
                                latest=latest, u=sql.Identifier(UNAVAILABLE))]
        wk = self._keys("w")
        for c in self.settings.columns:
            if c.name in self.settings.key or (columns is not None and c.name not in columns):
                continue
            name, col = sql.Literal(c.name), sql.Identifier(c.name)
            out.append(sql.SQL(
                "UPDATE {latest} AS l SET {col} = p.v, {u} = array_remove(l.{u}, {name}) FROM "
                "(SELECT DISTINCT ON ({wk}, w.topic, w.partition) {wk}, w.topic AS _t, "
                "w.partition AS _p, CASE WHEN f._tombstone THEN NULL ELSE f.{col} END AS v "
                "FROM {latest} AS w JOIN {c} AS f ON {on} WHERE {name} = ANY(w.{u}) AND "
                "{newer} AND (f._tombstone OR NOT coalesce({name} = ANY(f.{u}), false)){bound} "
                "ORDER BY {wk}, w.topic, w.partition, {fkey} DESC) AS p WHERE {lp} AND "
                "l.topic = p._t AND l.partition = p._p").format(
                    latest=latest, col=col, u=sql.Identifier(UNAVAILABLE), name=name, wk=wk,
                    c=candidates, on=self._on("w", "f"), newer=newer("w", "f"), bound=bound,
                    fkey=order_key("f"), lp=self._on("l", "p")))
        return out

    def _rekeyed_sql(self, rows: sql.Identifier, stored: sql.Composable | None,
                     columns: list[str] | None = None) -> list[sql.Composable]:
        """A primary-key change's create that left a column out (of ``columns``, else any
        non-key column) takes the value its old key (``OLD_KEY``) had just before it: the
        old key's newest older change among ``rows`` that has it (skipping its deletion by
        the change itself, and updates that left it out too), else, with ``stored`` (the
        results table), the old key's stored row, which the merge deletes later. A create
        whose old key was itself a create of a primary-key change waits for that one's
        value: repeated until nothing changes. ``rows`` then hold the values found (a
        column found nowhere stays left out: NULL, or the not-null check's error)."""
        key = self.settings.key
        old = [tables.OLD_KEY + k for k in key]
        hist, u = sql.Identifier(_REKEYED), sql.Identifier(UNAVAILABLE)
        old0 = sql.Identifier(old[0])

        def by_old(a: str, w: str) -> sql.Composable:  # a's key is w's old key
            return sql.SQL(" AND ").join(
                sql.SQL("{a}.{k} = {w}.{o}").format(a=sql.Identifier(a), w=sql.Identifier(w),
                                                   k=sql.Identifier(k), o=sql.Identifier(o))
                for k, o in zip(key, old, strict=True))

        out: list[sql.Composable] = [sql.SQL(
            "CREATE TEMP TABLE {hist} ON COMMIT DROP AS SELECT s.*, max({ts}) OVER (PARTITION "
            "BY {key}, s.topic, s.partition ORDER BY s.\"offset\") AS {o} FROM {rows} AS s "
            "WHERE s.{old0} IS NOT NULL OR ({key}) IN (SELECT {olds} FROM {rows} WHERE {old0} "
            "IS NOT NULL)").format(
                hist=hist, ts=usable_time("s"), key=self._keys("s"), o=sql.Identifier(ORDER_TIME),
                rows=rows, old0=old0, olds=identifiers(old))]
        body: list[sql.Composable] = []
        for c in self.settings.columns:
            if c.name in key or (columns is not None and c.name not in columns):
                continue
            name, col = sql.Literal(c.name), sql.Identifier(c.name)
            # The old key's changes before w that say its value: one that has it, or a
            # create of a primary-key change (whose value may be found yet).
            says = sql.SQL(
                "NOT q._tombstone AND {newer} AND (NOT coalesce({name} = ANY(q.{u}), false) "
                "OR q.{old0} IS NOT NULL)").format(newer=newer("w", "q"), name=name, u=u,
                                                   old0=old0)
            body.append(sql.SQL(
                "UPDATE {hist} AS s SET {col} = p.v, {u} = array_remove(s.{u}, {name}) FROM "
                "(SELECT DISTINCT ON (w.topic, w.partition, w.\"offset\") w.topic AS _t, "
                "w.partition AS _p, w.\"offset\" AS _o, q.{col} AS v, coalesce({name} = "
                "ANY(q.{u}), false) AS _waits FROM {hist} AS w JOIN {hist} AS q ON {by_old} "
                "WHERE w.{old0} IS NOT NULL AND {name} = ANY(w.{u}) AND {says} ORDER BY "
                "w.topic, w.partition, w.\"offset\", {qkey} DESC) AS p WHERE s.topic = p._t "
                "AND s.partition = p._p AND s.\"offset\" = p._o AND NOT p._waits").format(
                    hist=hist, col=col, u=u, name=name, by_old=by_old("q", "w"), old0=old0,
                    says=says, qkey=order_key("q")))
            if stored is not None:
                body.append(sql.SQL(
                    "UPDATE {hist} AS w SET {col} = r.{col}, {u} = array_remove(w.{u}, {name}) "
                    "FROM {res} AS r WHERE {r_old} AND w.{old0} IS NOT NULL AND {name} = "
                    "ANY(w.{u}) AND NOT EXISTS (SELECT FROM {hist} AS q WHERE {q_old} AND "
                    "{says})").format(hist=hist, col=col, u=u, name=name, res=stored,
                                      r_old=by_old("r", "w"), old0=old0,
                                      q_old=by_old("q", "w"), says=says))
        if not body:
            return []
        # Each statement above finds each row's value at most once: the loop ends.
        counted = sql.SQL(" ").join(sql.SQL("{}; GET DIAGNOSTICS n = ROW_COUNT; changed := "
                                            "changed + n;").format(b) for b in body)
        out.append(sql.SQL(
            "DO $rekeyed$ DECLARE n bigint; changed bigint; BEGIN LOOP changed := 0; {counted} "
            "EXIT WHEN changed = 0; END LOOP; END $rekeyed$").format(counted=counted))
        names = [c.name for c in self.settings.columns if c.name not in key]
        out += [sql.SQL(
            "UPDATE {rows} AS s SET {sets}, {u} = nullif(h.{u}, '{{}}') FROM {hist} AS h WHERE "
            "s.topic = h.topic AND s.partition = h.partition AND s.\"offset\" = h.\"offset\" "
            "AND h.{old0} IS NOT NULL AND s.{u} IS DISTINCT FROM h.{u}").format(
                rows=rows, u=u, hist=hist, old0=old0,
                sets=sql.SQL(", ").join(sql.SQL("{0} = h.{0}").format(sql.Identifier(n))
                                        for n in names)),
            sql.SQL("DROP TABLE {}").format(hist)]
        return out

    def state_sql(self, rows: sql.Identifier, state: sql.Identifier) -> list[sql.Composable]:
        """The newest record per key by the merge's own statements, as if every record were
        read in one run into an empty table: truncates placed, the newest per partition,
        the one ``newer`` puts last, unavailable values filled; a tombstone deletes it."""
        out: list[sql.Composable] = []
        if self._debezium:
            out += self._rekeyed_sql(rows, None)
        if self.settings.truncate == "apply":
            out += self._truncates_sql(rows, None)
        out += [self._newest_sql(rows, state), self._superseded_sql(state)]
        if self._debezium:
            out += self._fill_sql(state, rows, None)
        if self.settings.deletes:
            out.append(sql.SQL("DELETE FROM {} WHERE _tombstone").format(state))
        return out

    def state_columns(self) -> list[str]:
        # The order time is how the merge ranks the row, not its content; the coordinates
        # already say which record it is.
        return [c for c in super().state_columns() if c != ORDER_TIME]

    def lock_merges(self, conn: psycopg.Connection) -> None:
        # A backfill may publish beside the ingest (locks of their own): their merges take
        # turns, so each one's statements see what the other committed (a tombstone the
        # other just recorded, say) instead of an older snapshot.
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                     (MERGE_LOCK_CLASS, self.pipeline))

    def growth_note(self) -> str:
        return ("; an upsert key found in two partitions keeps the record the ordering rule "
                "puts last (its key's latest Kafka timestamp in its partition)")

    # ---- the merge ------------------------------------------------------------------------
    def merge(self, conn: psycopg.Connection, source: str, run: Run) -> Merged:
        sink, results, deleted_table = self.settings, self.results, self.deleted
        src = sql.Identifier(source)
        key = identifiers(sink.key)
        on = self._on
        res, gone = self.t(results.name), self.t(deleted_table.name)

        # The caller holds the merge lock (lock_merges).
        if self._debezium:  # before the old keys' rows are deleted (below)
            self._fill_rekeyed(conn, src, res)
        if sink.truncate == "apply" and conn.execute(sql.SQL(
                "SELECT EXISTS (SELECT FROM {} WHERE _tombstone AND {} IS NULL)").format(
                src, sql.Identifier(sink.key[0]))).fetchone()[0]:
            for statement in self._truncates_sql(src, res):
                conn.execute(statement)
        # Newest record per key and partition: one sort (bench/merge_profile.py: 1.2 s for
        # 2M rows). A key normally has one partition, so that is the run's newest per key;
        # count(DISTINCT) is the cheap test.
        latest = sql.Identifier(_LATEST)
        conn.execute(self._newest_sql(src, latest))
        rows, keys = conn.execute(sql.SQL("SELECT count(*), count(DISTINCT {k}) FROM {latest}")
                                  .format(k=key if len(sink.key) == 1 else
                                          sql.SQL("({})").format(key), latest=latest)
                                  ).fetchone()
        # Temp tables get no autovacuum: without statistics the joins below are planned blind.
        # Only the columns they join and filter on: a statistic of every column (a wide
        # text's too) cost ~3x as much (148 against ~45 ms for 42k rows).
        conn.execute(sql.SQL("ANALYZE {} ({})").format(latest, identifiers(self._analyzed)))
        o = sql.Identifier(ORDER_TIME)
        if rows != keys:  # their order times compared with each other: carried on first
            several = sql.SQL("({lk}) IN (SELECT {key} FROM {latest} GROUP BY {key} HAVING "
                              "count(*) > 1)").format(lk=self._keys("l"), key=key,
                                                      latest=latest)
            for stored in (res, gone):
                conn.execute(self._carry_sql(latest, stored, several))
            older = conn.execute(self._superseded_sql(latest)).rowcount
            log.info("upsert (%s): %d records superseded by their key's record in another "
                     "partition of this run (the topic grew?); across partitions the later "
                     "order time (the key's latest Kafka timestamp in its partition) is newer, "
                     "then the higher partition", run.kind, older,
                     extra={"event": "upsert.keys_in_partitions", "superseded": older})
        left_out = [c for (c,) in conn.execute(sql.SQL(
            "SELECT DISTINCT unnest({u}) FROM {latest}").format(
            u=sql.Identifier(UNAVAILABLE), latest=latest))] if self._debezium else []
        if left_out:  # some change left a column out: the values the row had
            some = sql.SQL("l.{} IS NOT NULL").format(sql.Identifier(UNAVAILABLE))
            for stored in (res, gone):
                conn.execute(self._carry_sql(latest, stored, some))
            for statement in self._fill_sql(latest, src, (res, gone), left_out):
                conn.execute(statement)
            self._check_unavailable_required(conn, latest, res, gone)
        names = [c.name for c in tables.written(results)]
        deleted = 0
        if sink.deletes:
            # A tombstone's order time carries on from the row it deletes (the same
            # partition's); from the tombstone it replaces, by ON CONFLICT below.
            conn.execute(self._carry_sql(latest, res, sql.SQL("l._tombstone")))
            deleted = conn.execute(sql.SQL(
                "DELETE FROM {res} AS r USING {latest} AS l WHERE l._tombstone AND {on} AND "
                "{newer}").format(res=res, latest=latest, on=on("l", "r"),
                                  newer=newer("l", "r"))).rowcount
            # Remembered unless the key's row is newer (a replayed old tombstone).
            gone_cols = identifiers(c.name for c in tables.written(deleted_table))
            conn.execute(sql.SQL(
                "INSERT INTO {gone} AS d ({cols}) SELECT {lcols} FROM {latest} AS l WHERE "
                "l._tombstone AND NOT EXISTS (SELECT FROM {res} AS r WHERE {on} AND NOT "
                "{newer_r}) ON CONFLICT ({key}) DO UPDATE SET topic = EXCLUDED.topic, "
                "partition = EXCLUDED.partition, \"offset\" = EXCLUDED.\"offset\", "
                "kafka_timestamp = EXCLUDED.kafka_timestamp, run_id = EXCLUDED.run_id, "
                "{o} = {carried}, deleted_at = now() WHERE {newer}").format(
                gone=gone, cols=gone_cols, latest=latest, key=key, res=res, on=on("r", "l"),
                lcols=sql.SQL(", ").join(sql.SQL("l.{}").format(sql.Identifier(c.name))
                                         for c in tables.written(deleted_table)),
                o=o, carried=_carried("excluded", "d"), newer_r=newer("l", "r"),
                newer=newer("excluded", "d")))
        live = sql.SQL("NOT l._tombstone AND ") if sink.deletes else sql.SQL("")

        def update(n: str) -> sql.Composable:
            if n == ORDER_TIME:
                return sql.SQL("{} = {}").format(o, _carried("l", "r"))
            # A column the change left out keeps the stored row's value.
            if self._debezium and n not in _COORDINATES and n in {
                    c.name for c in sink.columns}:
                return sql.SQL("{0} = CASE WHEN {1} = ANY(l.{2}) THEN r.{0} ELSE l.{0} END"
                               ).format(sql.Identifier(n), sql.Literal(n),
                                        sql.Identifier(UNAVAILABLE))
            return sql.SQL("{0} = l.{0}").format(sql.Identifier(n))

        # The run's newest records without a newer tombstone (one join), their order time
        # carried on from an older tombstone of the same partition.
        source = sql.SQL(
            "SELECT {lcols}{u}, {carried} AS {o} FROM {latest} AS l LEFT JOIN {gone} AS d ON "
            "{on_d} WHERE {live}(d.{k0} IS NULL OR {newer_d})").format(
            lcols=sql.SQL(", ").join(sql.SQL("l.{}").format(sql.Identifier(n))
                                     for n in names if n != ORDER_TIME),
            u=sql.SQL(", l.{}").format(sql.Identifier(UNAVAILABLE)) if self._debezium
            else sql.SQL(""), carried=_carried("l", "d"), o=o, latest=latest, gone=gone,
            on_d=on("d", "l"), live=live, k0=sql.Identifier(sink.key[0]),
            newer_d=newer("l", "d"))
        # MERGE, not INSERT ... ON CONFLICT: no speculative insertion and no lock on a row
        # kept (bench/merge_profile.py). Safe without ON CONFLICT's retry because
        # MERGE_LOCK_CLASS keeps every other writer of this table out.
        written = conn.execute(sql.SQL(
            "MERGE INTO {res} AS r USING ({source}) AS l ON {on_r} WHEN MATCHED AND {newer} "
            "THEN UPDATE SET {updates}, ingested_at = now() WHEN NOT MATCHED THEN INSERT "
            "({cols}) VALUES ({lcols})"
        ).format(res=res, cols=identifiers(names),
                 lcols=sql.SQL(", ").join(sql.SQL("l.{}").format(sql.Identifier(n))
                                          for n in names),
                 source=source, on_r=on("r", "l"),
                 updates=sql.SQL(", ").join(update(n) for n in names if n not in sink.key),
                 newer=newer("l", "r"))).rowcount
        # A tombstone superseded by a newer record of its key is done.
        conn.execute(sql.SQL(
            "DELETE FROM {gone} AS d USING {latest} AS l WHERE {live}{on} AND {newer}").format(
            gone=gone, latest=latest, live=live, on=on("l", "d"), newer=newer("l", "d")))
        # The next table's merge in the same transaction makes its own (a run of several
        # tables: driver/publish.py).
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(
            latest, sql.Identifier(_CANDIDATES)))
        return Merged(written, deleted)

    @property
    def _analyzed(self) -> list[str]:
        """The columns of the run's newest records the merge's statements join and filter
        on (``_LATEST``'s statistics)."""
        sink = self.settings
        return [*sink.key, *_COORDINATES, *(["_tombstone"] if sink.deletes else []),
                *([UNAVAILABLE] if self._debezium else [])]

    def _fill_rekeyed(self, conn: psycopg.Connection, src: sql.Identifier,
                      res: sql.Composable) -> None:
        """``_rekeyed_sql`` of the run's rows, when one is a primary-key change's create
        that left a column out (rare: one cheap look)."""
        old0 = sql.Identifier(tables.OLD_KEY + self.settings.key[0])
        left_out = [c for (c,) in conn.execute(sql.SQL(
            "SELECT DISTINCT unnest({u}) FROM {src} WHERE {old0} IS NOT NULL").format(
            u=sql.Identifier(UNAVAILABLE), src=src, old0=old0))]
        if left_out:
            for statement in self._rekeyed_sql(src, res, left_out):
                conn.execute(statement)

    def _carry_sql(self, latest: sql.Identifier, stored: sql.Composable,
                   where: sql.Composable) -> sql.Composable:
        """The run's newest records (those ``where`` picks) whose key's stored row or
        tombstone is of their partition: their order time carries on from its (a timestamp
        that went back there orders no earlier than the key's latest one)."""
        return sql.SQL(
            "UPDATE {latest} AS l SET {o} = {st} FROM {stored} AS r WHERE {where} AND {on} AND "
            "r.topic = l.topic AND r.partition = l.partition AND {st} > "
            "coalesce(l.{o}, '-infinity')").format(
                latest=latest, o=sql.Identifier(ORDER_TIME), st=order_time("r"),
                stored=stored, where=where, on=self._on("l", "r"))

    def _check_unavailable_required(self, conn, latest, res, gone) -> None:
        """A change that left a ``not null`` column out, of a key the table holds no value
        of (its first change read, or the first after a deletion): no row can be written."""
        required = [c.name for c in self.settings.columns
                    if c.required and c.name not in self.settings.key]
        if not required:
            return
        found = conn.execute(sql.SQL(
            "SELECT l.topic, l.partition, l.\"offset\", {lk}, array_to_string(ARRAY(SELECT "
            "unnest(l.{u}) INTERSECT SELECT unnest({req})), ', ') FROM {latest} AS l WHERE NOT "
            "l._tombstone AND l.{u} && {req} AND NOT EXISTS (SELECT FROM {res} AS r WHERE "
            "{on_r}) AND NOT EXISTS (SELECT FROM {gone} AS d WHERE {on_d} AND NOT {newer}) "
            "ORDER BY 1, 2, 3 LIMIT 1").format(
                lk=self._keys("l"), u=sql.Identifier(UNAVAILABLE),
                req=sql.SQL("{}::text[]").format(sql.Literal(required)), latest=latest,
                res=res, gone=gone,
                on_r=self._on("r", "l"), on_d=self._on("d", "l"), newer=newer("l", "d"))
        ).fetchone()
        if found:
            topic, partition, offset, *key, columns = found
            named = ", ".join(f"{k}={v}" for k, v in zip(self.settings.key, key, strict=True))
            table = self.settings.table
            raise DataError(
                f"upsert: the change at {topic}[{partition}] offset {offset} of key ({named}) "
                f"leaves the not-null column(s) {columns} out (Debezium's placeholder of an "
                f"unchanged TOASTed value, under REPLICA IDENTITY DEFAULT) and {table} holds "
                "no earlier value of it: declare it without 'not null' in [sink.columns] and "
                f"run 'ALTER TABLE {table} ALTER COLUMN ... DROP NOT NULL' (it is then NULL "
                "until a change carries it), or give the source table REPLICA IDENTITY FULL "
                "and re-snapshot it; nothing committed")


def _carried(incoming: str, stored: str) -> sql.Composable:
    """``incoming``'s order time, carried on from ``stored`` (a row or tombstone of its key,
    or nothing: NULLs) when that is of the same partition."""
    i, s = sql.Identifier(incoming), sql.Identifier(stored)
    return sql.SQL("greatest({i}.{o}, CASE WHEN {s}.topic = {i}.topic AND {s}.partition = "
                   "{i}.partition THEN {st} END)").format(
        i=i, s=s, o=sql.Identifier(ORDER_TIME), st=order_time(stored))


def _order_time_column() -> Column:
    """``ORDER_TIME``: a column of the pipeline's own (init-db adds it to an older table)."""
    return Column(ORDER_TIME, tables.TIMESTAMPTZ, info={"upgrade": True})
