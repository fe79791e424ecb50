-- The ledger rows of a run with a [sink] transform: the records the transform filtered out
-- (in neither table) are counted, and the content hash is of another kind, computed in
-- Spark SQL where Spark's Kafka source reads the records (executor/content_hash.py,
-- spark/record_hash.py): 'blake2b' for the built-in sinks' rows, 'md5sum' for a transform's.
ALTER TABLE {schema}.pipeline_ranges
    ADD COLUMN IF NOT EXISTS filtered bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS hash_kind text NOT NULL DEFAULT 'blake2b';
