-- The source of truth for where each pipeline resumes: the NEXT offset to read per
-- partition (the exclusive end of the last published range). Written only by the
-- transaction that publishes the results of that range, by compare-and-set.
CREATE TABLE IF NOT EXISTS {schema}.pipeline_offsets (
    pipeline     text        NOT NULL,
    topic        text        NOT NULL,
    "partition"  integer     NOT NULL,
    next_offset  bigint      NOT NULL CHECK (next_offset >= 0),
    updated_at   timestamptz NOT NULL DEFAULT now(),
    run_id       bigint,
    PRIMARY KEY (pipeline, topic, "partition")
);
