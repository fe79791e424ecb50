-- The sample shop: the source database the CDC chain captures whole (scripts/cdc up applies
-- this to the database 'shop'; docs/cdc.md). Idempotent.
--
-- The workload (python -m pipeline.sample_shop run) keeps these invariants in every one of
-- its transactions, so a replica that shows a broken one shows a torn source transaction:
--   * an order's total is the sum of its lines' amounts, its line_count their number
--     (an order and its lines are written in one transaction; a line change adjusts the
--     order in the same transaction);
--   * the balances of all accounts sum to 0: money moves between accounts only, and what
--     a customer deposits comes out of the house account (customer_id NULL);
--   * every line's order, every order's and account's customer exists.
-- carts is kept out of all of them: the workload TRUNCATEs it now and then.
-- orders.channel is not here: the workload adds it mid-stream (ALTER TABLE ... ADD COLUMN).

CREATE TABLE IF NOT EXISTS customers (
    id          bigint PRIMARY KEY,
    name        text NOT NULL,
    email       text NOT NULL,
    -- > 8 KB of incompressible text, so stored out of line (TOAST). With REPLICA IDENTITY
    -- DEFAULT an update that leaves it unchanged is decoded without its value.
    profile     text NOT NULL,
    prefs       jsonb NOT NULL,
    created_at  timestamptz NOT NULL,
    updated_at  timestamptz NOT NULL
);
ALTER TABLE customers REPLICA IDENTITY DEFAULT;

CREATE TABLE IF NOT EXISTS accounts (
    id          bigint PRIMARY KEY,
    customer_id bigint REFERENCES customers (id) ON UPDATE CASCADE,
    balance     numeric NOT NULL,   -- no precision or scale: any scale may occur
    opened_on   date NOT NULL,
    updated_at  timestamptz NOT NULL
);

CREATE TABLE IF NOT EXISTS orders (
    id          bigint PRIMARY KEY,
    customer_id bigint NOT NULL REFERENCES customers (id) ON UPDATE CASCADE,
    status      text NOT NULL,
    total       numeric(14,2) NOT NULL,
    line_count  integer NOT NULL,
    placed_at   timestamptz NOT NULL,
    updated_at  timestamp NOT NULL   -- without time zone, on purpose
);

CREATE TABLE IF NOT EXISTS order_lines (
    order_id    bigint NOT NULL REFERENCES orders (id) ON DELETE CASCADE,
    line_no     integer NOT NULL,
    sku         text NOT NULL,
    qty         integer NOT NULL,
    unit_price  numeric(10,2) NOT NULL,
    amount      numeric(12,2) NOT NULL,
    PRIMARY KEY (order_id, line_no)
);

CREATE TABLE IF NOT EXISTS carts (
    id          bigint PRIMARY KEY,
    customer_id bigint NOT NULL,     -- no foreign key: TRUNCATE carts alone must work
    sku         text NOT NULL,
    qty         integer NOT NULL,
    added_at    timestamptz NOT NULL
);
