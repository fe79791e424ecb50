-- Records that could not become result rows, with their original coordinates, written in
-- the same transaction as the results of their run.
CREATE TABLE IF NOT EXISTS {schema}.pipeline_dead_letters (
    pipeline         text        NOT NULL,
    topic            text        NOT NULL,
    "partition"      integer     NOT NULL,
    "offset"         bigint      NOT NULL,
    key              bytea,
    value            bytea,
    headers          jsonb,
    kafka_timestamp  timestamptz,
    error_type       text        NOT NULL,
    error_message    text        NOT NULL,
    run_id           bigint      NOT NULL,
    failed_at        timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, topic, "partition", "offset")
);
