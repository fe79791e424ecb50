-- The source transactions a pipeline published whole ([sink] transactions: Debezium's
-- transaction metadata), recorded in the publishing transaction that published them: Kafka
-- Connect writes a transaction's events, and its END, again after a restart, and a
-- transaction published before is no obstacle to the next cut (plan/transactions.py).
-- tx: the source transaction's id (Postgres: source.txId). Pruned by age
-- (store/source_transactions.py): a transaction written again is read within minutes of
-- the first time, and Postgres reuses transaction ids after 2^32 of them.
CREATE TABLE IF NOT EXISTS {schema}.pipeline_source_transactions (
    pipeline      text        NOT NULL,
    tx            text        NOT NULL,
    run_id        bigint      NOT NULL,
    published_at  timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (pipeline, tx)
);
CREATE INDEX IF NOT EXISTS pipeline_source_transactions_by_age
    ON {schema}.pipeline_source_transactions (pipeline, published_at);
