-- The ledger rows of a run with a [sink] transform: the records the transform filtered out
-- (in neither table) are counted, and the content hash is of another kind
-- (executor/content_hash.py): 'blake2b' for the built-in sinks' rows, 'md5sum' (a sum of
-- each record's MD5) for a transform's.
ALTER TABLE {schema}.pipeline_ranges
    ADD COLUMN IF NOT EXISTS filtered bigint NOT NULL DEFAULT 0,
    ADD COLUMN IF NOT EXISTS hash_kind text NOT NULL DEFAULT 'blake2b';
