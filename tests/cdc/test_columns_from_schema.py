"""``[sink] columns = "schema"`` on the real chain, through the CLI: the shop's ``accounts``
(a NUMERIC without precision) and ``orders`` (numeric(14,2), timestamptz, a timestamp
without time zone, and ``channel``, which the workload adds mid-stream) replicated from
Debezium's JSON (schema envelope) and Avro (through the registry) topics into tables made
from the writer's schema (accounts by init-db, orders by its first run, which stops before
the column was added); the next run, evolve off, is exit 2 naming the ALTER; with evolve
on, it adds the column. Every column equals the source's row by row
(pipeline/sample_shop_compare.py), the balances with the scale each has in its change
event; ``pipeline verify`` compares those scales too."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from pipeline.errors import EXIT_CONFIG, EXIT_DATA, EXIT_OK
from pipeline.sample_shop_compare import compare
from tests.cdc.conftest import SOURCE_URL, ShopRun
from tests.helpers import BOOTSTRAP, TEST_DB_URL, cli_here, query, unique

pytestmark = pytest.mark.integration


def config(path: Path, name: str, topic: str, table: str, schema: str, registry: str | None,
           *, evolve: bool = True, cap: int | None = None) -> Path:
    fmt = "avro" if registry else "json"
    path.write_text(f"""
[pipeline]
name = "{name}"
[kafka]
bootstrap_servers = "{BOOTSTRAP}"
topics = ["{topic}"]
timeout_seconds = 20
{f"max_records_per_partition = {cap}" if cap else ""}
[database]
url = "{TEST_DB_URL}"
schema = "{schema}"
[sink]
format = "{fmt}"
envelope = "debezium"
mode = "upsert"
table = "{table}"
columns = "schema"
truncate = "apply"
{'evolve = "add_columns"' if evolve else ""}
{f'[schema_registry]{chr(10)}url = "{registry}"' if registry else ""}
[spark]
master = "local[1]"
""")
    return path


def cli(*args) -> tuple[int, str]:
    r = cli_here(*args)
    return r.returncode, r.stdout + r.stderr


def columns_of(schema: str, table: str) -> list[str]:
    return [r[0] for r in query(
        "SELECT column_name FROM information_schema.columns WHERE table_schema = %s AND "
        "table_name = %s ORDER BY ordinal_position", (schema, table))]


def first_offset_with_channel(shop_run: ShopRun, fmt: str) -> int:
    """Where the orders topic's events first carry the column the workload added."""
    events = [e for e in (shop_run.json if fmt == "json" else shop_run.avro).table("orders")
              if e.value is not None]
    if fmt == "json":
        return next(e.offset for e in events if b'"field":"channel"' in e.value)
    newest = events[-1].value[1:5]  # the writer schema id of the events after the ALTER
    return next(e.offset for e in events if e.value[1:5] == newest)


@pytest.mark.parametrize("fmt", ["json", "avro"])
def test_accounts_and_orders_replicate_exactly_and_the_added_column_is_evolved(
        shop_run, tmp_path, fmt):
    schema = unique(f"replica_{fmt}")
    registry = shop_run.registry_url if fmt == "avro" else None
    topic = f"shop_{fmt}.public.{{}}"

    accounts = config(tmp_path / "accounts.toml", f"{schema}_accounts",
                      topic.format("accounts"), "accounts", schema, registry)
    code, out = cli("init-db", "--config", accounts)
    assert code == EXIT_OK, out
    assert f"applied upsert table {schema}.accounts" in out  # from the writer's schema
    code, out = cli("run", "--config", accounts)
    assert code == EXIT_OK, out
    [diff] = compare(SOURCE_URL, TEST_DB_URL, schema, tables=["accounts"])
    assert diff.equal, diff.first
    # NUMERIC without precision: balances of several scales, each kept exactly as Debezium
    # sends it, which is without trailing zeros (156410.4160 arrives as 156410.416, 0.00 as
    # 0: docs/cdc.md); a decimal(p,s) would pad or round them all to one scale.
    with psycopg.connect(SOURCE_URL) as src:
        balances = src.execute("SELECT id, trim_scale(balance)::text FROM accounts ORDER BY id"
                               ).fetchall()
    assert len({len(b.partition(".")[2]) for _, b in balances}) > 2
    assert query(f'SELECT id, balance::text FROM "{schema}".accounts ORDER BY id') == balances

    # orders: the first run, which makes the table (init-db would take the newest events'
    # schema, channel included), stops before the events that carry channel.
    before = first_offset_with_channel(shop_run, fmt)
    orders = tmp_path / "orders.toml"
    config(orders, f"{schema}_orders", topic.format("orders"), "orders", schema, registry,
           cap=before)
    code, out = cli("run", "--config", orders)
    assert code == EXIT_OK, out
    assert "channel" not in columns_of(schema, "orders")
    assert {"total", "placed_at", "updated_at"} <= set(columns_of(schema, "orders"))

    config(orders, f"{schema}_orders", topic.format("orders"), "orders", schema, registry,
           evolve=False)
    code, out = cli("run", "--config", orders)
    assert code == EXIT_CONFIG, out
    assert (f'ALTER TABLE "{schema}"."orders" ADD COLUMN "channel" text\' or set '
            "sink.evolve = 'add_columns'; nothing was read") in out

    config(orders, f"{schema}_orders", topic.format("orders"), "orders", schema, registry)
    code, out = cli("run", "--config", orders)
    assert code == EXIT_OK, out
    assert "channel" in columns_of(schema, "orders")
    [diff] = compare(SOURCE_URL, TEST_DB_URL, schema, tables=["orders"])
    assert diff.equal, diff.first
    assert query(f'SELECT count(*) FROM "{schema}".orders WHERE channel IS NOT NULL')[0][0] > 0

    if fmt == "json":  # verify compares the balances with their scale
        code, out = cli("verify", "--config", accounts)
        assert code == EXIT_OK, out
        # The same value with one more (zero) place: 1.5 -> 1.50.
        [(changed, was, now)] = query(
            f'UPDATE "{schema}".accounts a SET balance = round(balance, scale(balance) + 1) '
            f'FROM (SELECT id, balance::text AS was FROM "{schema}".accounts WHERE balance IS '
            "NOT NULL ORDER BY id LIMIT 1) o WHERE a.id = o.id RETURNING a.id, o.was, "
            "a.balance::text")
        assert now == (f"{was}0" if "." in was else f"{was}.0")
        code, out = cli("verify", "--config", accounts)
        assert code == EXIT_DATA, out
        assert f"key ({changed}): missing" in out
