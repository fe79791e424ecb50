-- The ledger of published ranges: one row per read task's offset range of a run, written
-- in the publishing transaction (so it commits or rolls back with the rows and offsets),
-- with what the range held when it was read: Kafka records, how they were published, the
-- offsets without a record (transaction markers, aborted records, compaction) and a
-- content hash of the records. 'pipeline verify' compares Kafka and the tables with it.
CREATE TABLE IF NOT EXISTS {schema}.pipeline_ranges (
    pipeline       text        NOT NULL,
    run_id         bigint      NOT NULL,
    topic          text        NOT NULL,
    "partition"    integer     NOT NULL,
    from_offset    bigint      NOT NULL,
    until_offset   bigint      NOT NULL,  -- exclusive
    records        bigint      NOT NULL,  -- Kafka records read
    rows_written   bigint      NOT NULL,  -- of them, result rows
    dead_letters   bigint      NOT NULL,  -- of them, dead letters
    deletes        bigint      NOT NULL,  -- of them, an upsert sink's tombstones
    skipped        bigint      NOT NULL,  -- offsets of the range with no record
    content_hash   bytea       NOT NULL,  -- executor/content_hash.py
    published_at   timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, run_id, topic, "partition", from_offset)
);
-- verify reads a partition's ranges in offset order.
CREATE INDEX IF NOT EXISTS pipeline_ranges_by_partition
    ON {schema}.pipeline_ranges (pipeline, topic, "partition", from_offset);
