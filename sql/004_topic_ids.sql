-- Kafka's topic ID beside each stored offset: a topic deleted and created again under the
-- same name gets a new ID and restarts at offset 0, so offsets and rows of the old one
-- must not be taken for the new one's (see pipeline/offsets.py check_topic_ids).
ALTER TABLE {schema}.pipeline_offsets ADD COLUMN IF NOT EXISTS topic_id text;

-- Where 'pipeline offsets reset' moves the dead letters of a topic that was recreated, in
-- the same transaction as the reset: kept, but out of the way of the new topic's offsets.
-- (Result rows go to "<results table>_archived", created on first use.)
CREATE TABLE IF NOT EXISTS {schema}.pipeline_dead_letters_archived (
    LIKE {schema}.pipeline_dead_letters INCLUDING DEFAULTS,
    topic_id         text,
    archived_at      timestamptz NOT NULL DEFAULT now(),
    archived_by_run  bigint
);
