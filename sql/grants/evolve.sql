-- Optional: only for [sink] evolve = "add_columns" (docs/operations.md, "Schema evolution").
-- Postgres has no ALTER privilege to grant: only a table's owner, or a member of the owning
-- role, may ALTER TABLE ... ADD COLUMN. So the results table is handed to a NOLOGIN group
-- role that the job's role joins. Applied by the owner (a superuser, or a role with
-- CREATEROLE) after sql/grants/pipeline_role.sql, with psql:
--
--   psql "$OWNER_URL" -X -v ON_ERROR_STOP=1 -v role=pipeline -v schema=public \
--        -v results=demo_orders -v owners=demo_orders_owners -f sql/grants/evolve.sql
--
-- Idempotent. What it costs: a member of the owning role may also DROP or TRUNCATE the
-- results table (ownership comes whole); the pipeline never does. Leave evolve off, and add
-- columns by hand as the owner, where that is not acceptable.

SELECT format('CREATE ROLE %I NOLOGIN', :'owners')
 WHERE NOT EXISTS (SELECT FROM pg_roles WHERE rolname = :'owners')
\gexec
-- The owner keeps its hold on the table through the group (ALTER ... OWNER TO needs it), the
-- job's role gets ALTER; the new owner needs CREATE on the schema to own a table there.
GRANT :"owners" TO CURRENT_USER;
GRANT :"owners" TO :"role";
GRANT USAGE, CREATE ON SCHEMA :"schema" TO :"owners";
ALTER TABLE :"schema".:"results" OWNER TO :"owners";
