"""The sample shop's pure parts: the workload's plan, the invariant checks, the comparison
of a replica with its source (pipeline/sample_shop_*.py). The real chain runs them in
tests/cdc/."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from decimal import Decimal

from pipeline.sample_shop_compare import diff_table, same
from pipeline.sample_shop_invariants import Snapshot, Watch, check
from pipeline.sample_shop_workload import Planner, plan


def consistent() -> dict:
    return {"orders": {1: (10, Decimal("30.00"), 2), 2: (11, Decimal("5.50"), 1)},
            "lines": {1: (Decimal("30.00"), 2), 2: (Decimal("5.5"), 1)},
            "customers": frozenset({10, 11}), "account_customers": frozenset({10}),
            "balance_sum": Decimal("0.000"), "accounts": 3}


def broken(**change) -> set[str]:
    return {b.check for b in check(Snapshot(**{**consistent(), **change}))}


def test_a_consistent_snapshot_breaks_nothing():
    assert check(Snapshot(**consistent())) == []


def test_an_order_without_its_lines_breaks_its_total_and_count():
    assert broken(lines={1: (Decimal("30.00"), 2)}) == {"order_total", "order_line_count"}


def test_a_line_change_without_its_order_update_breaks_the_total():
    assert broken(lines={1: (Decimal("31.00"), 2), 2: (Decimal("5.50"), 1)}) == {"order_total"}


def test_lines_without_their_order_are_orphans():
    assert broken(orders={1: (10, Decimal("30.00"), 2)}) == {"orphan_lines"}


def test_an_order_or_account_of_a_missing_customer_breaks_references():
    assert broken(customers=frozenset({11})) == {"order_customer", "account_customer"}


def test_half_a_transfer_breaks_the_balance_sum():
    found = check(Snapshot(**{**consistent(), "balance_sum": Decimal("-12.345")}))
    assert [b.check for b in found] == ["balance_sum"]
    assert "-12.345" in found[0].samples[0]


def test_watch_counts_polls_and_keeps_the_first_sighting():
    w = Watch()
    w.add(0, 0.0, [])
    bad = check(Snapshot(**{**consistent(), "balance_sum": Decimal(1)}))
    w.add(1, 0.2, bad)
    w.add(2, 0.4, bad)
    s = w.summary()
    assert (s["polls"], s["broken_polls"]) == (3, 2)
    assert s["checks"]["balance_sum"]["polls"] == 2
    assert s["checks"]["balance_sum"]["first"]["poll"] == 1


def test_the_plan_is_the_same_for_a_seed_and_differs_between_seeds():
    def statements(seed):
        return [t.statements for t in plan(seed, 200)]

    assert statements(5) == statements(5)
    assert statements(5) != statements(6)


def test_even_a_short_run_has_every_case_the_chain_must_carry():
    kinds = [t.kind for t in plan(1, 20)]
    assert kinds[0] == "setup" and len(kinds) == 20
    for kind in ("add_to_cart", "rename_customer", "rekey_customer", "purge_carts",
                 "add_channel"):
        assert kind in kinds, kind
    sql = [q for t in plan(1, 20) for q, _ in t.statements]
    assert "TRUNCATE carts" in sql and "ALTER TABLE orders ADD COLUMN channel text" in sql
    assert any(q.startswith("UPDATE customers SET id =") for q in sql)
    # The column is filled once it exists: every order placed after it names a channel.
    added = sql.index("ALTER TABLE orders ADD COLUMN channel text")
    assert all("channel" in q for q in sql[added:] if q.startswith("INSERT INTO orders"))


def test_the_model_keeps_the_invariants_after_every_planned_transaction():
    p = Planner(3, 3000)
    for _ in p.transactions():
        m = p.model
        assert m.balance_sum() == 0
        assert all(len(o.lines) >= 1 and o.customer_id in m.customers for o in m.orders.values())
        assert all(c is None or c in m.customers for c, _ in m.accounts.values())


def test_values_compare_by_meaning():
    assert same(Decimal("1.50"), Decimal("1.5"))
    assert same(Decimal("12.345"), 12.345)          # a double column's value
    assert not same(Decimal("0.1000000000000000055"), 0.1)
    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    assert same(at, at.astimezone(timezone(timedelta(hours=2))))
    assert same(at.replace(tzinfo=None), at)        # naive read as UTC
    assert not same(at, at + timedelta(microseconds=1))
    assert same({"a": [1, 2]}, '{"a": [1, 2]}')     # jsonb against json kept as text
    assert same(b"\x00\x01", memoryview(b"\x00\x01"))
    assert not same(None, "") and same(None, None)
    assert not same("__debezium_unavailable_value", "x" * 9000)


def test_diff_table_counts_missing_extra_and_differing_rows_by_column():
    key = ["id"]
    src = {(Decimal(1),): {"id": 1, "a": "x", "b": 1}, (Decimal(2),): {"id": 2, "a": "y", "b": 2},
           (Decimal(3),): {"id": 3, "a": "z", "b": 3}}
    dst = {(Decimal(1),): {"id": 1, "a": "x", "b": 1.0}, (Decimal(2),): {"id": 2, "a": "?", "b": 2},
           (Decimal(4),): {"id": 4, "a": "w", "b": 4}}
    d = diff_table("t", key, ["id", "a", "b"], src, dst, {"id", "a", "b", "extra"})
    assert (d.missing, d.extra, d.differing, d.columns) == (1, 1, 1, {"a": 1})
    assert not d.equal
    assert any("id=2" in line and "'y'" in line and "'?'" in line for line in d.first)
    same_rows = diff_table("t", key, ["id", "a", "b"], src, src, {"id", "a", "b"})
    assert same_rows.equal and same_rows.first == []


def test_a_column_the_replica_lacks_is_a_difference():
    row = {(Decimal(1),): {"id": 1, "channel": "web"}}
    d = diff_table("orders", ["id"], ["id", "channel"], row, {(Decimal(1),): {"id": 1}}, {"id"})
    assert d.missing_columns == ["channel"] and not d.equal


def test_the_replica_config_routes_every_shop_table_to_its_own_table_by_its_key():
    import tomllib

    from pipeline.config import parse_settings
    from pipeline.sample_shop_replica import COLUMNS, TABLES, config

    text = config("shop", "127.0.0.1:9092", "postgresql://u@h/db", "replica",
                  records_per_partition=100)
    s = parse_settings(tomllib.loads(text), "<test>", {})
    routes = {r.table: r for r in s.routes.tables(s.kafka.topics)}
    assert sorted(routes) == sorted(TABLES)
    assert routes["order_lines"].sink.key == ("order_id", "line_no")
    assert routes["orders"].sink.key == ("id",) and routes["orders"].topics == (
        "shop_json.public.orders",)
    # orders.channel, added mid-stream by the workload, is declared from the start.
    assert [c.name for c in routes["orders"].sink.columns] == list(COLUMNS["orders"])
    assert {r.sink.truncate for r in routes.values()} == {"apply"}
    assert s.kafka.max_records_per_partition == 100 and s.schema == "replica"
