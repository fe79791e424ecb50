"""upsert: per business key, the newest record (see ``newer``), the same rule within a run
and across runs, for an ingest, a backfill and a reprocess alike; it replaces the stored row
only if it is newer, so a re-read of an old range (or of an old partition after the topic
grew) never overwrites newer state. Tombstones delete, and are kept in ``<table>_deleted``
so that an older record replayed later cannot bring the row back."""

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

from pipeline.sinks.base import Merged, Sink
from pipeline.store import tables
from pipeline.store.identifiers import identifiers
from pipeline.store.run import Run

log = logging.getLogger(__name__)

_LATEST = "_publish_latest"  # temp table: the run's newest record per key
MERGE_LOCK_CLASS = 7_400_002  # advisory lock of the upsert merges (store.LOCK_CLASS + 1)
_COORDINATES = ("topic", "partition", "offset")


def newer(incoming: str, stored: str) -> sql.Composable:
    """``incoming`` (a record) supersedes ``stored`` (the row or tombstone of its key).

    Within one partition Kafka's order decides: the higher offset is newer, whatever the
    timestamps say. Across partitions (the topic grew, so Kafka's key hash moved the key; or
    a pipeline of two topics) no offset order exists, so the later Kafka record timestamp
    wins; equal timestamps: the higher partition number (growth adds higher-numbered
    partitions, where a moved key's records go from then on), then the topic name. A NULL
    timestamp is older than any. So two different partitions never tie: any two records of
    a key are ordered, nothing blocks. The same expression picks the run's newest record per
    key (``Upsert.merge``) and compares it with the stored row or tombstone, whatever the
    kind of run, so how records fall into runs changes nothing (docs/reliability.md,
    "Upsert across partitions")."""
    i, s = sql.Identifier(incoming), sql.Identifier(stored)

    def order(t: sql.Identifier) -> sql.Composable:
        return sql.SQL("(coalesce({t}.kafka_timestamp, '-infinity'), {t}.partition, {t}.topic)"
                       ).format(t=t)
    return sql.SQL(
        "(CASE WHEN {i}.topic = {s}.topic AND {i}.partition = {s}.partition "
        "THEN {i}.\"offset\" > {s}.\"offset\" ELSE {oi} > {os} END)").format(
        i=i, s=s, oi=order(i), os=order(s))


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
        say which record the row is (it replaces the row only from a newer offset)."""
        sink = self.settings
        return Table(
            sink.table, MetaData(schema=tables.SCHEMA),
            *[Column(c.name, c.type, nullable=c.name not in _COORDINATES and c.nullable,
                     server_default=c.server_default, autoincrement=False)
              for c in self.records.columns],
            PrimaryKeyConstraint(*sink.key, name=f"{sink.table}_pkey"))

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
            Column("deleted_at", tables.TIMESTAMPTZ, nullable=False, server_default=func.now()))

    @property
    def tables(self) -> list[Table]:
        return [self.results, self.deleted]

    def archive_recreated(self, conn, topic, archive_results) -> int:
        rows = archive_results()
        # The old topic's tombstones go: their offsets are the old topic's, and would hide
        # the new topic's records.
        conn.execute(sql.SQL("DELETE FROM {} WHERE topic = %s").format(
            self.t(self.deleted.name)), (topic,))
        return rows

    def state_sql(self, rows: sql.Identifier, state: sql.Identifier) -> list[sql.Composable]:
        """The newest record per key (``newer``: offsets within a partition, then the Kafka
        timestamp across), a tombstone deleting it."""
        key = identifiers(self.settings.key)
        on = sql.SQL(" AND ").join(sql.SQL("o.{k} = l.{k}").format(k=sql.Identifier(k))
                                   for k in self.settings.key)
        out = [sql.SQL("CREATE TEMP TABLE {state} ON COMMIT DROP AS SELECT DISTINCT ON ({key}, "
                       "topic, partition) * FROM {rows} ORDER BY {key}, topic, partition, "
                       "\"offset\" DESC").format(state=state, key=key, rows=rows),
               sql.SQL("DELETE FROM {s} AS o USING {s} AS l WHERE {on} AND {newer}")
               .format(s=state, on=on, newer=newer("l", "o"))]
        if self.settings.deletes:
            out.append(sql.SQL("DELETE FROM {} WHERE _tombstone").format(state))
        return out

    def growth_note(self) -> str:
        return ("; an upsert key found in two partitions keeps its record with the latest "
                "Kafka timestamp")

    def lock_merges(self, conn: psycopg.Connection) -> None:
        # A backfill may publish beside the ingest (locks of their own): their merges take
        # turns, so each one's statements see what the other committed (a tombstone the
        # other just recorded, say) instead of an older snapshot.
        conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                     (MERGE_LOCK_CLASS, self.pipeline))

    def merge(self, conn: psycopg.Connection, source: str, run: Run) -> Merged:
        sink, results, deleted_table = self.settings, self.results, self.deleted
        src = sql.Identifier(source)
        key = identifiers(sink.key)

        def on(a: str, b: str) -> sql.Composable:
            return sql.SQL(" AND ").join(
                sql.SQL("{a}.{k} = {b}.{k}").format(a=sql.Identifier(a), b=sql.Identifier(b),
                                                    k=sql.Identifier(k)) for k in sink.key)

        # The caller holds the merge lock (lock_merges).
        # Newest record per key and partition: one sort (bench/merge_profile.py: 1.2 s for
        # 2M rows). A key normally has one partition, so that is the run's newest per key;
        # count(DISTINCT) is the cheap test. One sort cannot order by ``newer`` (offsets
        # within a partition, timestamps across), so a key in several partitions (a topic
        # that grew) keeps, of its per-partition newest, the one ``newer`` puts last: the
        # rule across runs.
        latest = sql.Identifier(_LATEST)
        conn.execute(sql.SQL(
            "CREATE TEMP TABLE {latest} ON COMMIT DROP AS SELECT DISTINCT ON ({key}, topic, "
            "partition) * FROM {src} ORDER BY {key}, topic, partition, \"offset\" DESC").format(
            latest=latest, key=key, src=src))
        rows, keys = conn.execute(sql.SQL("SELECT count(*), count(DISTINCT {k}) FROM {latest}")
                                  .format(k=key if len(sink.key) == 1 else
                                          sql.SQL("({})").format(key), latest=latest)
                                  ).fetchone()
        # Temp tables get no autovacuum: without statistics the joins below are planned blind.
        conn.execute(sql.SQL("ANALYZE {}").format(latest))
        if rows != keys:
            older = conn.execute(sql.SQL(
                "DELETE FROM {latest} AS o USING {latest} AS l WHERE {on} AND {newer}").format(
                latest=latest, on=on("o", "l"), newer=newer("l", "o"))).rowcount
            log.info("upsert (%s): %d records superseded by their key's record in another "
                     "partition of this run (the topic grew?); across partitions the later "
                     "Kafka timestamp is newer, then the higher partition", run.kind, older,
                     extra={"event": "upsert.keys_in_partitions", "superseded": older})
        res, gone = self.t(results.name), self.t(deleted_table.name)
        names = [c.name for c in tables.written(results)]
        deleted = 0
        if sink.deletes:
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
                "deleted_at = now() WHERE {newer}").format(
                gone=gone, cols=gone_cols, latest=latest, key=key, res=res, on=on("r", "l"),
                lcols=sql.SQL(", ").join(sql.SQL("l.{}").format(sql.Identifier(c.name))
                                         for c in tables.written(deleted_table)),
                newer_r=newer("l", "r"), newer=newer("excluded", "d")))
        live = sql.SQL("NOT l._tombstone AND ") if sink.deletes else sql.SQL("")
        # MERGE, not INSERT ... ON CONFLICT: no speculative insertion and no lock on a row
        # kept (bench/merge_profile.py). Safe without ON CONFLICT's retry because
        # MERGE_LOCK_CLASS keeps every other writer of this table out.
        written = conn.execute(sql.SQL(
            "MERGE INTO {res} AS r USING (SELECT * FROM {latest} AS l WHERE {live}"
            "NOT EXISTS (SELECT FROM {gone} AS d WHERE {on_d} AND NOT {newer_d})) AS l ON "
            "{on_r} WHEN MATCHED AND {newer} THEN UPDATE SET {updates}, ingested_at = now() "
            "WHEN NOT MATCHED THEN INSERT ({cols}) VALUES ({lcols})"
        ).format(res=res, cols=identifiers(names),
                 lcols=sql.SQL(", ").join(sql.SQL("l.{}").format(sql.Identifier(n))
                                          for n in names),
                 latest=latest, live=live, gone=gone, on_d=on("d", "l"),
                 newer_d=newer("l", "d"), on_r=on("r", "l"),
                 updates=sql.SQL(", ").join(sql.SQL("{0} = l.{0}").format(sql.Identifier(n))
                                            for n in names if n not in sink.key),
                 newer=newer("l", "r"))).rowcount
        # A tombstone superseded by a newer record of its key is done.
        conn.execute(sql.SQL(
            "DELETE FROM {gone} AS d USING {latest} AS l WHERE {live}{on} AND {newer}").format(
            gone=gone, latest=latest, live=live, on=on("l", "d"), newer=newer("l", "d")))
        return Merged(written, deleted)
