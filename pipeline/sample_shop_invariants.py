"""The sample shop's invariants (conf/examples/cdc/shop.sql), checked on one snapshot of a
replica. Every source transaction keeps them, so a replica that shows one broken shows a
source transaction torn apart: part of it applied, part not (yet).

``fetch`` reads the facts in one REPEATABLE READ transaction (a table the replica has not
created yet is empty; columns other than the ones read are ignored); ``check`` is pure.
``Watch`` adds up the polls of a reader.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from decimal import Decimal

SAMPLES = 5  # broken items kept per check and poll


@dataclass(frozen=True)
class Snapshot:
    """What the invariants need of one snapshot of the shop."""

    orders: dict[int, tuple[int, Decimal, int]]  # id -> (customer_id, total, line_count)
    lines: dict[int, tuple[Decimal, int]]        # order_id -> (sum of amounts, count)
    customers: frozenset[int]
    account_customers: frozenset[int]            # accounts' customer ids (not the house's)
    balance_sum: Decimal
    accounts: int


@dataclass(frozen=True)
class Broken:
    check: str
    count: int
    samples: list[str]


def _cut(items: list[str]) -> list[str]:
    return sorted(items)[:SAMPLES]


def check(s: Snapshot) -> list[Broken]:
    """Every invariant the snapshot breaks, with how many items break it."""
    out = []
    totals = [f"order {o}: total {total} != lines {s.lines.get(o, (Decimal(0), 0))[0]}"
              for o, (_, total, _) in s.orders.items()
              if Decimal(total) != Decimal(s.lines.get(o, (Decimal(0), 0))[0])]
    counts = [f"order {o}: line_count {n} != {s.lines.get(o, (0, 0))[1]} lines"
              for o, (_, _, n) in s.orders.items() if n != s.lines.get(o, (0, 0))[1]]
    orphans = [f"{n} line(s) of order {o}, which does not exist"
               for o, (_, n) in s.lines.items() if o not in s.orders]
    no_customer = [f"order {o}: customer {c} does not exist"
                   for o, (c, _, _) in s.orders.items() if c not in s.customers]
    no_owner = [f"accounts of customer {c}, who does not exist"
                for c in s.account_customers if c not in s.customers]
    for name, items in (("order_total", totals), ("order_line_count", counts),
                        ("orphan_lines", orphans), ("order_customer", no_customer),
                        ("account_customer", no_owner)):
        if items:
            out.append(Broken(name, len(items), _cut(items)))
    if Decimal(s.balance_sum) != 0:
        out.append(Broken("balance_sum", 1, [f"the {s.accounts} balances sum to "
                                             f"{s.balance_sum}, not 0"]))
    return out


# Money as numeric whatever type the replica gave it: a double precision column's values
# then add up as the decimals they print as (a float sum of 0.1 + 0.2 is not 0.3).
QUERIES = {
    "orders": "SELECT id, customer_id, total::numeric, line_count FROM {}.orders",
    "lines": "SELECT order_id, sum(amount::numeric), count(*) FROM {}.order_lines "
             "GROUP BY order_id",
    "customers": "SELECT id FROM {}.customers",
    "account_customers": "SELECT DISTINCT customer_id FROM {}.accounts "
                         "WHERE customer_id IS NOT NULL",
    "balances": "SELECT coalesce(sum(balance::numeric), 0), count(*) FROM {}.accounts",
}


def fetch(conn, schema: str) -> Snapshot:
    """The facts of one snapshot: one REPEATABLE READ, read-only transaction (``conn`` a
    psycopg connection in autocommit mode)."""
    from psycopg import sql

    with conn.transaction():
        conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
        have = {r[0] for r in conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s",
            (schema,))}

        def rows(name: str, table: str) -> list[tuple]:
            if table not in have:
                return []
            return conn.execute(sql.SQL(QUERIES[name]).format(sql.Identifier(schema))).fetchall()

        balances = rows("balances", "accounts") or [(Decimal(0), 0)]
        return Snapshot(
            orders={r[0]: (r[1], r[2], r[3]) for r in rows("orders", "orders")},
            lines={r[0]: (r[1], r[2]) for r in rows("lines", "order_lines")},
            customers=frozenset(r[0] for r in rows("customers", "customers")),
            account_customers=frozenset(r[0] for r in rows("account_customers", "accounts")),
            balance_sum=balances[0][0], accounts=balances[0][1])


@dataclass
class Watch:
    """The polls of one reader added up: how often each invariant was seen broken."""

    polls: int = 0
    broken_polls: int = 0
    checks: dict[str, dict] = field(default_factory=dict)

    def add(self, poll: int, at: float, broken: list[Broken]) -> None:
        self.polls += 1
        if broken:
            self.broken_polls += 1
        for b in broken:
            c = self.checks.setdefault(b.check, {"polls": 0, "max_items": 0, "first": None})
            c["polls"] += 1
            c["max_items"] = max(c["max_items"], b.count)
            if c["first"] is None:
                c["first"] = {"poll": poll, "seconds": round(at, 3), "items": b.count,
                              "samples": b.samples}

    def summary(self) -> dict:
        return {"polls": self.polls, "broken_polls": self.broken_polls,
                "checks": self.checks}
