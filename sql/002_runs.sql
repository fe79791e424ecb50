-- One row per run (ingest, backfill, reprocess, offsets change): what it planned, what it
-- read and wrote, how long each stage took, and how it ended.
CREATE TABLE IF NOT EXISTS {schema}.pipeline_runs (
    run_id         bigserial   PRIMARY KEY,
    pipeline       text        NOT NULL,
    kind           text        NOT NULL,   -- ingest | backfill | reprocess | offsets
    status         text        NOT NULL,   -- running | succeeded | noop | failed | abandoned
    started_at     timestamptz NOT NULL DEFAULT now(),
    finished_at    timestamptz,
    planned        jsonb       NOT NULL DEFAULT '[]',  -- [{topic, partition, from, until}]
    lost           jsonb       NOT NULL DEFAULT '[]',  -- ranges skipped by on_data_loss=skip
    records_read   bigint,
    rows_written   bigint,
    dead_letters   bigint,
    per_partition  jsonb,
    timings        jsonb,
    error          text,
    exit_code      integer,
    host           text,
    pid            integer,
    details        jsonb
);
CREATE INDEX IF NOT EXISTS pipeline_runs_by_pipeline ON {schema}.pipeline_runs (pipeline, run_id DESC);
