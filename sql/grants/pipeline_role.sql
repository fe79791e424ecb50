-- What the job's login role may do in one schema, and nothing more. Applied by the owner
-- (the role that ran 'pipeline init-db') after init-db, with psql:
--
--   psql "$OWNER_URL" -X -v ON_ERROR_STOP=1 -v role=pipeline -v schema=public \
--        -v results=demo_orders -f sql/grants/pipeline_role.sql
--
-- Idempotent (GRANT twice is a no-op). Not in sql/ itself: init-db does not know the role.
-- The role is created by the DBA (or scripts/stack): LOGIN, a password, NOSUPERUSER.
-- Why each grant (docs/security.md):

-- The tables by name; CREATE: every run makes its own UNLOGGED staging table, written by
-- the executors and dropped in the publishing transaction (the role owns what it creates,
-- so it may also drop the staging of a run that crashed; 'offsets reset' creates
-- <results>_archived on first use).
GRANT USAGE, CREATE ON SCHEMA :"schema" TO :"role";

-- Offsets: read to plan, compare-and-set on publish (UPDATE), first run of a partition
-- (INSERT), 'offsets set/reset' forgets a partition (DELETE).
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".pipeline_offsets TO :"role";

-- Run rows: inserted at start (the bigserial's sequence), updated when the run ends.
GRANT SELECT, INSERT, UPDATE ON :"schema".pipeline_runs TO :"role";
GRANT USAGE ON SEQUENCE :"schema".pipeline_runs_run_id_seq TO :"role";

-- Dead letters: inserted on publish; a reprocess replaces (UPDATE) or removes (DELETE)
-- those of its ranges; a replay updates (UPDATE) or removes (DELETE) those it re-decodes; 'offsets reset' of a recreated topic moves them to the archive.
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".pipeline_dead_letters TO :"role";
GRANT SELECT, INSERT ON :"schema".pipeline_dead_letters_archived TO :"role";
-- 'dead-letters replay' moves the dead letters it turned into rows (sql/005).
GRANT SELECT, INSERT ON :"schema".pipeline_dead_letters_replayed TO :"role";

-- The ledger of published ranges (sql/006): inserted on publish, read by 'pipeline verify'.
GRANT SELECT, INSERT ON :"schema".pipeline_ranges TO :"role";

-- The source transactions published whole (sql/008, [sink] transactions): looked up by the
-- cut, inserted on publish, pruned by age (DELETE).
GRANT SELECT, INSERT, DELETE ON :"schema".pipeline_source_transactions TO :"role";

-- The results table: COPY/INSERT on publish, ON CONFLICT DO UPDATE and DELETE on
-- reprocess, DELETE when 'offsets reset' archives a recreated topic's rows.
GRANT SELECT, INSERT, UPDATE, DELETE ON :"schema".:"results" TO :"role";

-- An upsert sink's tombstones (<results>_deleted, only there for sink.mode = 'upsert'):
-- kept and superseded on publish, cleared on reprocess and 'offsets reset'.
SELECT format('GRANT SELECT, INSERT, UPDATE, DELETE ON %I.%I TO %I', :'schema',
              :'results' || '_deleted', :'role')
 WHERE to_regclass(format('%I.%I', :'schema', :'results' || '_deleted')) IS NOT NULL
\gexec

-- Not granted: TRUNCATE, REFERENCES, TRIGGER, ownership of any table above (no ALTER, no
-- DROP), other schemas, roles (pg_signal_backend: 'pipeline unlock --force' stays an
-- owner's command). Temporary tables (the publishing COPY's) come with the database's
-- default TEMPORARY privilege for PUBLIC.
