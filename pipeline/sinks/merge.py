"""How a run's rows land in its results table, per ``[sink] mode``: the statements that
pipeline/driver/publish.py runs inside the publishing transaction, after the run's rows were
copied into a temp table (``tables.record_batch``: one row per record, plus an upsert
sink's tombstones).

Exactly once comes from the transaction, not from here: these statements commit with the
offsets' compare-and-set or not at all, so each range is applied once (docs/reliability.md).
What each mode adds:

- append: keep a row already there (ON CONFLICT DO NOTHING), or replace it on reprocess.
- upsert: per business key, the newest record (see ``newer``), the same rule within a run
  and across runs, for an ingest, a backfill and a reprocess alike; it replaces the stored
  row only if it is newer, so a re-read of an old range (or of an old partition after the
  topic grew) never overwrites newer state. Tombstones delete, and are kept in
  ``<table>_deleted`` so that an older record replayed later cannot bring the row back.
- aggregate: per group, the run's sum/count/min/max, added to the stored ones.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from psycopg import sql

from pipeline.store import tables

log = logging.getLogger(__name__)


@dataclass
class Merged:
    rows: int  # rows inserted or updated (append, upsert) / groups changed (aggregate)
    deleted: int = 0  # rows deleted by tombstones (upsert)


def _ids(names) -> sql.Composed:
    return sql.SQL(", ").join(map(sql.Identifier, names))


def merge(store, conn, source: str, kind: str, run_id: int, overwrite: bool) -> Merged:
    """Merge run ``run_id``'s rows (temp table ``source``) into the results table."""
    mode = store.settings.sink.mode
    if mode == "upsert":
        return _upsert(store, conn, source, kind)
    if mode == "aggregate":
        return Merged(conn.execute(aggregate_sql(store, source), (run_id,))
                      .rowcount)
    return Merged(conn.execute(append_sql(store, source, overwrite)).rowcount)


def append_sql(store, source: str, overwrite: bool) -> sql.Composed:
    """Rows already present in a planned range: keep them (ON CONFLICT DO NOTHING), or
    replace them on reprocess."""
    names = [c.name for c in tables.written(store.results)]
    keys = [c.name for c in store.results.primary_key]
    fmt = {"res": store.t(store.results.name), "src": sql.Identifier(source),
           "cols": _ids(names), "key": _ids(keys)}
    if not overwrite:
        return sql.SQL("INSERT INTO {res} ({cols}) SELECT {cols} FROM {src} "
                       "ON CONFLICT ({key}) DO NOTHING").format(**fmt)
    updates = sql.SQL(", ").join(sql.SQL("{0} = EXCLUDED.{0}").format(sql.Identifier(n))
                                 for n in names if n not in keys)
    return sql.SQL(
        "INSERT INTO {res} ({cols}) SELECT DISTINCT ON ({key}) {cols} FROM {src} "
        "ON CONFLICT ({key}) DO UPDATE SET {upd}, ingested_at = now()").format(
        **fmt, upd=updates)


# ---- upsert ------------------------------------------------------------------------------
_LATEST = "_publish_latest"  # temp table: the run's newest record per key
MERGE_LOCK_CLASS = 7_400_002  # advisory lock of the upsert merges (store.LOCK_CLASS + 1)


def newer(incoming: str, stored: str) -> sql.Composable:
    """``incoming`` (a record) supersedes ``stored`` (the row or tombstone of its key).

    Within one partition Kafka's order decides: the higher offset is newer, whatever the
    timestamps say. Across partitions (the topic grew, so Kafka's key hash moved the key; or
    a pipeline of two topics) no offset order exists, so the later Kafka record timestamp
    wins; equal timestamps: the higher partition number (growth adds higher-numbered
    partitions, where a moved key's records go from then on), then the topic name. A NULL
    timestamp is older than any. So two different partitions never tie: any two records of
    a key are ordered, nothing blocks. The same expression picks the run's newest record per
    key (``_upsert``) and compares it with the stored row or tombstone, whatever the kind of
    run, so how records fall into runs changes nothing (docs/reliability.md, "Upsert across
    partitions")."""
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


def _upsert(store, conn, source: str, kind: str) -> Merged:
    sink, results = store.settings.sink, store.results
    deleted_table = tables.deleted(sink)
    src = sql.Identifier(source)
    key = _ids(sink.key)

    def on(a: str, b: str) -> sql.Composable:
        return sql.SQL(" AND ").join(
            sql.SQL("{a}.{k} = {b}.{k}").format(a=sql.Identifier(a), b=sql.Identifier(b),
                                                k=sql.Identifier(k)) for k in sink.key)

    # A backfill may publish beside the ingest (locks of their own): their merges take
    # turns, so each one's statements see what the other committed (a tombstone the other
    # just recorded, say) instead of an older snapshot.
    conn.execute("SELECT pg_advisory_xact_lock(%s, hashtext(%s))",
                 (MERGE_LOCK_CLASS, store.pipeline))
    # Newest record per key and partition: one sort (bench/merge_profile.py: 1.2 s for 2M
    # rows). A key normally has one partition, so that is the run's newest per key;
    # count(DISTINCT) is the cheap test. One sort cannot order by ``newer`` (offsets within
    # a partition, timestamps across), so a key in several partitions (a topic that grew)
    # keeps, of its per-partition newest, the one ``newer`` puts last: the rule across runs.
    latest = sql.Identifier(_LATEST)
    conn.execute(sql.SQL(
        "CREATE TEMP TABLE {latest} ON COMMIT DROP AS SELECT DISTINCT ON ({key}, topic, "
        "partition) * FROM {src} ORDER BY {key}, topic, partition, \"offset\" DESC").format(
        latest=latest, key=key, src=src))
    rows, keys = conn.execute(sql.SQL("SELECT count(*), count(DISTINCT {k}) FROM {latest}")
                              .format(k=key if len(sink.key) == 1 else
                                      sql.SQL("({})").format(key), latest=latest)).fetchone()
    # Temp tables get no autovacuum: without statistics the joins below are planned blind.
    conn.execute(sql.SQL("ANALYZE {}").format(latest))
    if rows != keys:
        older = conn.execute(sql.SQL(
            "DELETE FROM {latest} AS o USING {latest} AS l WHERE {on} AND {newer}").format(
            latest=latest, on=on("o", "l"), newer=newer("l", "o"))).rowcount
        log.info("upsert (%s): %d records superseded by their key's record in another "
                 "partition of this run (the topic grew?); across partitions the later Kafka "
                 "timestamp is newer, then the higher partition", kind, older,
                 extra={"event": "upsert.keys_in_partitions", "superseded": older})
    res, gone = store.t(results.name), store.t(deleted_table.name)
    names = [c.name for c in tables.written(results)]
    deleted = 0
    if sink.deletes:
        deleted = conn.execute(sql.SQL(
            "DELETE FROM {res} AS r USING {latest} AS l WHERE l._tombstone AND {on} AND {newer}"
        ).format(res=res, latest=latest, on=on("l", "r"), newer=newer("l", "r"))).rowcount
        # Remembered unless the key's row is newer (a replayed old tombstone).
        gone_cols = _ids(c.name for c in tables.written(deleted_table))
        conn.execute(sql.SQL(
            "INSERT INTO {gone} AS d ({cols}) SELECT {lcols} FROM {latest} AS l WHERE "
            "l._tombstone AND NOT EXISTS (SELECT FROM {res} AS r WHERE {on} AND NOT {newer_r}) "
            "ON CONFLICT ({key}) DO UPDATE SET topic = EXCLUDED.topic, partition = "
            "EXCLUDED.partition, \"offset\" = EXCLUDED.\"offset\", kafka_timestamp = "
            "EXCLUDED.kafka_timestamp, run_id = EXCLUDED.run_id, deleted_at = now() "
            "WHERE {newer}").format(
            gone=gone, cols=gone_cols, latest=latest, key=key, res=res, on=on("r", "l"),
            lcols=sql.SQL(", ").join(sql.SQL("l.{}").format(sql.Identifier(c.name))
                                     for c in tables.written(deleted_table)),
            newer_r=newer("l", "r"), newer=newer("excluded", "d")))
    live = sql.SQL("NOT l._tombstone AND ") if sink.deletes else sql.SQL("")
    # MERGE, not INSERT ... ON CONFLICT: no speculative insertion and no lock on a row kept
    # (bench/merge_profile.py). Safe without ON CONFLICT's retry because MERGE_LOCK_CLASS
    # keeps every other writer of this table out.
    written = conn.execute(sql.SQL(
        "MERGE INTO {res} AS r USING (SELECT * FROM {latest} AS l WHERE {live}"
        "NOT EXISTS (SELECT FROM {gone} AS d WHERE {on_d} AND NOT {newer_d})) AS l ON {on_r} "
        "WHEN MATCHED AND {newer} THEN UPDATE SET {updates}, ingested_at = now() "
        "WHEN NOT MATCHED THEN INSERT ({cols}) VALUES ({lcols})"
    ).format(res=res, cols=_ids(names),
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


# ---- aggregate ---------------------------------------------------------------------------
def aggregate_sql(store, source: str) -> sql.Composed:
    """The run's aggregates per group, added to the stored ones (%s: the run's id). A sum
    or count adds up; min and max keep the extreme; a NULL (no value yet) is no value."""
    sink = store.settings.sink
    computed, merged = [], []
    for a in sink.aggregates:
        name = sql.Identifier(a.name)
        arg = sql.SQL("*") if a.of is None else sql.Identifier(a.of)
        computed.append(sql.SQL("{f}({arg})").format(f=sql.SQL(a.function), arg=arg))
        merged.append(sql.SQL("{n} = {how}").format(n=name, how=sql.SQL({
            "sum": "coalesce(g.{n} + EXCLUDED.{n}, g.{n}, EXCLUDED.{n})",
            "count": "coalesce(g.{n} + EXCLUDED.{n}, g.{n}, EXCLUDED.{n})",
            "min": "least(g.{n}, EXCLUDED.{n})",
            "max": "greatest(g.{n}, EXCLUDED.{n})"}[a.function]).format(n=name)))
    key = _ids(sink.key)
    return sql.SQL(
        "INSERT INTO {res} AS g ({key}, {aggs}, run_id) SELECT {key}, {computed}, %s "
        "FROM {src} GROUP BY {key} ON CONFLICT ({key}) DO UPDATE SET {merged}, "
        "run_id = EXCLUDED.run_id, updated_at = now()").format(
        res=store.t(store.results.name), key=key, aggs=_ids(a.name for a in sink.aggregates),
        computed=sql.SQL(", ").join(computed), src=sql.Identifier(source),
        merged=sql.SQL(", ").join(merged))
