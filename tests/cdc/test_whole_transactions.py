"""``[sink] transactions``: a run of several tables publishes whole source transactions only,
on the real chain, through the CLI. The shop's orders and order_lines (Debezium's JSON
topics) into two tables; kafka.max_records_per_partition ends the lines' range inside a
source transaction that placed an order. Without the metadata that run shows a reader
orders without all their lines; with ``transactions = "shop_json.transaction"`` the cut
keeps every transaction whole, a budget smaller than the next transaction is read past
(the transaction published whole), the replica ends equal to the source and ``verify``
holds for the ranges cut short. A transaction topic that does not exist is exit 2 naming
provide.transaction.metadata; one whose unread offsets retention deleted is exit 3 naming
them, or with kafka.on_data_loss = "skip" a run that says so in its run row."""

from __future__ import annotations

import json
from pathlib import Path

import psycopg
import pytest

from pipeline.errors import EXIT_CONFIG, EXIT_DATA, EXIT_OK
from pipeline.sample_shop_compare import compare
from pipeline.sample_shop_invariants import check, fetch
from tests.cdc.conftest import SOURCE_URL, ShopRun, tx_of
from tests.helpers import BOOTSTRAP, TEST_DB_URL, cli_here, delete_records, query, unique

pytestmark = pytest.mark.integration

ORDERS, LINES = "shop_json.public.orders", "shop_json.public.order_lines"
# What a torn order_placed transaction breaks (the replica has no customers or accounts).
ORDER_CHECKS = ("order_total", "order_line_count", "orphan_lines")


TRANSACTIONS = "shop_json.transaction"


def config(path: Path, name: str, schema: str, *, cap: int | None,
           transactions: str | None, on_data_loss: str = "fail",
           registry: str | None = None) -> Path:
    orders, lines = ((ORDERS, LINES) if registry is None else
                     (t.replace("shop_json", "shop_avro") for t in (ORDERS, LINES)))
    path.write_text(f"""
[pipeline]
name = "{name}"
[kafka]
bootstrap_servers = "{BOOTSTRAP}"
topics = ["{orders}", "{lines}"]
timeout_seconds = 20
on_data_loss = "{on_data_loss}"
{f"max_records_per_partition = {cap}" if cap else ""}
[database]
url = "{TEST_DB_URL}"
schema = "{schema}"
[sink]
format = "{'avro' if registry else 'json'}"
envelope = "debezium"
mode = "upsert"
table = "{{table}}"
key = ["id"]
{f'transactions = "{transactions}"' if transactions else ""}
[sink.columns]
id = "long not null"
customer_id = "long not null"
total = "decimal(14,2)"
line_count = "int"
[sink.topics."{lines}"]
key = ["order_id", "line_no"]
[sink.topics."{lines}".columns]
order_id = "long not null"
line_no = "int not null"
sku = "string"
qty = "int"
amount = "decimal(12,2)"
{f'[schema_registry]{chr(10)}url = "{registry}"' if registry else ""}
[spark]
master = "local[1]"
""")
    return path


def cli(*args) -> tuple[int, str, str]:
    r = cli_here(*args)
    return r.returncode, r.stdout, r.stdout + r.stderr


def init_and_run(path) -> tuple[dict, str]:
    """init-db, then one run with --json, both exit 0: the run's ``transactions`` and its
    whole output."""
    code, _, out = cli("init-db", "--config", path)
    assert code == EXIT_OK, out
    code, stdout, out = cli("run", "--config", path, "--json")
    assert code == EXIT_OK, out
    return json.loads(stdout)["transactions"], out


def torn(schema: str) -> list[str]:
    with psycopg.connect(TEST_DB_URL, autocommit=True) as conn:
        return [f"{b.check}: {b.samples}" for b in check(fetch(conn, schema))
                if b.check in ORDER_CHECKS]


def cut_inside_a_transaction(shop_run: ShopRun) -> int:
    """A per-partition budget that reads every order event and ends the lines' range
    between two events of one source transaction (of two lines or more)."""
    orders = [e for e in shop_run.json.table("orders") if e.value is not None]
    lines = [e for e in shop_run.json.table("order_lines") if e.value is not None]
    assert lines[0].offset == 0 and orders[0].offset == 0, "a fresh chain's topics"
    start = shop_run.json.table("orders")[-1].offset + 1
    for cap in range(start, shop_run.json.table("order_lines")[-1].offset):
        here, after = (e.json()["payload"]["transaction"] for e in
                       (shop_run.json.table("order_lines")[cap - 1],
                        shop_run.json.table("order_lines")[cap]))
        if here and after and tx_of(here["id"]) == tx_of(after["id"]):
            return cap
    pytest.fail("no source transaction of two lines after the orders' last event")


def test_a_run_of_several_tables_publishes_whole_source_transactions(shop_run, tmp_path):
    cap = cut_inside_a_transaction(shop_run)

    # Without the metadata: the budget tears an order's transaction apart.
    schema = torn_schema = unique("torn")
    plain = config(tmp_path / "plain.toml", schema, schema, cap=cap, transactions=None)
    for args in (("init-db", "--config", plain), ("run", "--config", plain)):
        code, _, out = cli(*args)
        assert code == EXIT_OK, out
    assert torn(schema), "the budget did not end inside a transaction of an order"

    # With it: the same budget, every transaction whole.
    schema = unique("whole")
    whole = config(tmp_path / "whole.toml", schema, schema, cap=cap, transactions=TRANSACTIONS)
    summary, out = init_and_run(whole)
    assert torn(schema) == []
    assert summary["topic"] == "shop_json.transaction" and summary["included"] > 0
    [short] = [c for c in summary["cut"] if c["topic"] == LINES]
    assert short["until"] < cap and summary["blocked"]["missing"][LINES]["read"] > 0
    assert f"{LINES}[0] publishes [0, {short['until']}) of [0, {cap})" in out

    # A budget of one record per partition: the next transaction is larger, so the run
    # reads past it rather than publish nothing, and catches up whole.
    config(whole, schema, schema, cap=1, transactions=TRANSACTIONS)
    code, stdout, out = cli("run", "--config", whole, "--json")
    assert code == EXIT_OK, out
    assert "planning again without kafka.max_records_per_partition" in out
    assert torn(schema) == []
    assert json.loads(stdout)["transactions"]["cut"] == []
    for diff in compare(SOURCE_URL, TEST_DB_URL, schema, tables=["orders", "order_lines"]):
        # Row by row in the columns the replica declares.
        assert diff.source_rows > 0 and not (diff.missing or diff.extra or diff.differing), \
            diff.first

    code, _, out = cli("verify", "--config", whole)
    assert code == EXIT_OK, out


    # The torn pipeline, turned to whole transactions: no such transaction topic is exit 2
    # before anything is read.
    schema = torn_schema
    config(plain, schema, schema, cap=None, transactions="shop_json.no_transactions")
    code, _, out = cli("run", "--config", plain)
    assert code == EXIT_CONFIG, out
    assert ("the transaction topic 'shop_json.no_transactions' ([sink] transactions) does not "
            "exist" in out and "provide.transaction.metadata=true" in out)

    # Its stored transaction topic offset 0, and retention deleting offset 0 before it was
    # read: exit 3 naming the offsets, then with on_data_loss = "skip" a run that records the
    # gap and publishes whole transactions again.
    query(f'INSERT INTO "{schema}".pipeline_offsets (pipeline, topic, "partition", '
          "next_offset) VALUES (%s, %s, 0, 0) RETURNING 1", (schema, TRANSACTIONS))
    delete_records(TRANSACTIONS, 0, 1)
    config(plain, schema, schema, cap=None, transactions=TRANSACTIONS)
    code, _, out = cli("run", "--config", plain)
    assert code == EXIT_DATA, out
    assert f"data loss: the transaction topic {TRANSACTIONS}[0] offsets [0, 1) were deleted" in out
    config(plain, schema, schema, cap=None, transactions=TRANSACTIONS, on_data_loss="skip")
    code, stdout, out = cli("run", "--config", plain, "--json")
    assert code == EXIT_OK, out
    assert json.loads(stdout)["transactions"]["metadata"]["lost"] == {
        "topic": TRANSACTIONS, "partition": 0, "from": 0, "until": 1, "offsets": 1}
    assert torn(schema) == []


def test_avro_transaction_metadata_keeps_transactions_whole_too(shop_run, tmp_path):
    """The Avro connector's transaction topic (its END events decoded through the
    registry) cuts the same budget at the same place."""
    cap = cut_inside_a_transaction(shop_run)  # the Avro topics hold the same events
    schema = unique("whole_avro")
    avro = config(tmp_path / "avro.toml", schema, schema, cap=cap,
                  transactions="shop_avro.transaction", registry=shop_run.registry_url)
    summary, _ = init_and_run(avro)
    assert torn(schema) == []
    assert summary["included"] > 0
    assert "shop_avro.public.order_lines" in [c["topic"] for c in summary["cut"]]
    assert summary["blocked"]["missing"]["shop_avro.public.order_lines"]["read"] > 0
