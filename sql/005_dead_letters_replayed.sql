-- Dead letters that 'pipeline dead-letters replay' turned into result rows: moved here in
-- the replay's own transaction (with the rows it wrote and its run row), so that
-- pipeline_dead_letters keeps meaning "records that are not results" and the original
-- bytes and reason stay for audit. No key: a record may be replayed again after a
-- reprocess made it a dead letter once more.
CREATE TABLE IF NOT EXISTS {schema}.pipeline_dead_letters_replayed (
    LIKE {schema}.pipeline_dead_letters INCLUDING DEFAULTS,
    replayed_run_id  bigint      NOT NULL,
    replayed_at      timestamptz NOT NULL DEFAULT now()
);
