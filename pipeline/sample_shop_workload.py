"""The sample shop's workload, planned without I/O: a seed and a count give the same
transactions every time, each a list of SQL statements that keeps the shop's invariants
(conf/examples/cdc/shop.sql) by itself. ``ShopModel`` is the shop as the workload left it,
so each step picks rows that exist; the tests replay the plan on the model alone.

Besides the random mix, some steps happen at fixed points of every run, so that even a
short run has each case the CDC chain must carry: a primary-key change, a TRUNCATE, a
column added mid-stream (then filled), an update that leaves the TOASTed profile as it is.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import orjson

Statement = tuple[str, tuple]
T0 = datetime(2026, 1, 1, tzinfo=UTC)
HOUSE = 1  # the house account: customers' deposits come out of it, so all balances sum to 0
PROFILE_BYTES = 9 * 1024  # base64 of random bytes: ~12 KB that pglz cannot compress
STATUSES = ("placed", "paid", "packed", "shipped", "delivered")
CHANNELS = ("web", "store", "phone", "app")
SKUS = tuple(f"SKU-{i:04d}" for i in range(200))
INITIAL_CUSTOMERS = 20

# The random mix: (step, weight). A step whose rows do not exist yet places an order.
MIX = (("place_order", 24), ("transfer", 24), ("add_line", 6), ("change_qty", 6),
       ("remove_line", 4), ("order_status", 8), ("delete_order", 4), ("new_customer", 5),
       ("rename_customer", 6), ("new_profile", 1), ("open_account", 2), ("close_account", 1),
       ("delete_customer", 1), ("rekey_customer", 1), ("add_to_cart", 7))

# Fixed points of every run, as fractions of its transactions.
SCHEDULE = ((0.05, "add_to_cart"), (0.10, "rename_customer"), (0.30, "rekey_customer"),
            (0.40, "purge_carts"), (0.50, "add_channel"), (0.55, "place_order"),
            (0.80, "purge_carts"))

# Before a run: an empty shop, by deletes (a sink that creates its tables from the first
# event it sees cannot create one from a truncate), without the column the run adds.
RESET: list[Statement] = [
    ("ALTER TABLE orders DROP COLUMN IF EXISTS channel", ()),
    *((f"DELETE FROM {t}", ()) for t in ("order_lines", "orders", "accounts", "carts",
                                          "customers")),
]


@dataclass
class Order:
    customer_id: int
    lines: dict[int, tuple[int, Decimal]]  # line_no -> (qty, unit_price)

    def total(self) -> Decimal:
        return sum((q * p for q, p in self.lines.values()), Decimal("0.00"))


@dataclass
class ShopModel:
    """What the shop holds after the planned steps, as far as choosing the next one needs."""

    customers: set[int] = field(default_factory=set)
    accounts: dict[int, tuple[int | None, Decimal]] = field(default_factory=dict)
    orders: dict[int, Order] = field(default_factory=dict)
    carts: int = 0
    has_channel: bool = False
    next_id: dict[str, int] = field(default_factory=lambda: {"customer": 1, "account": 1,
                                                             "order": 1, "cart": 1})

    def new_id(self, kind: str) -> int:
        n = self.next_id[kind]
        self.next_id[kind] = n + 1
        return n

    def balance_sum(self) -> Decimal:
        return sum((b for _, b in self.accounts.values()), Decimal(0))


@dataclass(frozen=True)
class Txn:
    kind: str
    statements: list[Statement]


class Planner:
    """Plans ``count`` transactions from ``seed``; iterate over ``transactions()``."""

    def __init__(self, seed: int, count: int):
        self.rng = random.Random(seed)
        self.count = count
        self.model = ShopModel()
        self.step = 0
        self.fixed = {max(1, int(count * f)): kind for f, kind in SCHEDULE}

    # ---- helpers --------------------------------------------------------------------------
    def now(self) -> datetime:
        """A clock of its own: one second per step, plus microseconds (deterministic)."""
        return T0 + timedelta(seconds=self.step, microseconds=self.rng.randrange(1_000_000))

    def profile(self) -> str:
        return base64.b64encode(self.rng.randbytes(PROFILE_BYTES)).decode()

    def prefs(self) -> str:
        return orjson.dumps({"newsletter": self.rng.random() < 0.5,
                             "lang": self.rng.choice(["en", "de", "fr", "ja"]),
                             "tags": self.rng.sample(["vip", "b2b", "gift", "eco"], 2)}).decode()

    def money(self, scale: int | None = None) -> Decimal:
        """An amount with 2 to 4 decimals: balances are NUMERIC without a scale."""
        scale = scale if scale is not None else self.rng.choice((2, 2, 2, 3, 4))
        return Decimal(self.rng.randrange(1, 50_000 * 10**scale)).scaleb(-scale)

    def pick(self, items):
        return self.rng.choice(sorted(items))

    # ---- steps ------------------------------------------------------------------------------
    def setup(self) -> list[Statement]:
        m = self.model
        house = m.new_id("account")
        m.accounts[house] = (None, Decimal("0.00"))
        out = [("INSERT INTO accounts (id, customer_id, balance, opened_on, updated_at) "
                "VALUES (%s, NULL, %s, %s, %s)", (house, Decimal("0.00"), T0.date(), T0))]
        for _ in range(INITIAL_CUSTOMERS):
            out += self.new_customer()
        return out

    def new_customer(self) -> list[Statement]:
        m, now = self.model, self.now()
        cid = m.new_id("customer")
        m.customers.add(cid)
        out = [("INSERT INTO customers (id, name, email, profile, prefs, created_at, updated_at)"
                " VALUES (%s, %s, %s, %s, %s, %s, %s)",
                (cid, f"customer {cid}", f"c{cid}@shop.example", self.profile(), self.prefs(),
                 now, now))]
        return out + self.open_account(cid)

    def open_account(self, cid: int | None = None) -> list[Statement]:
        m, now = self.model, self.now()
        if cid is None:
            cid = self.pick(m.customers)
        aid, deposit = m.new_id("account"), self.money()
        m.accounts[aid] = (cid, deposit)
        hc, hb = m.accounts[HOUSE]
        m.accounts[HOUSE] = (hc, hb - deposit)
        return [("INSERT INTO accounts (id, customer_id, balance, opened_on, updated_at) "
                 "VALUES (%s, %s, %s, %s, %s)", (aid, cid, deposit, now.date(), now)),
                ("UPDATE accounts SET balance = balance - %s, updated_at = %s WHERE id = %s",
                 (deposit, now, HOUSE))]

    def move(self, src: int, dst: int, amount: Decimal) -> list[Statement]:
        m, now = self.model, self.now()
        sc, sb = m.accounts[src]
        m.accounts[src] = (sc, sb - amount)
        dc, db = m.accounts[dst]
        m.accounts[dst] = (dc, db + amount)
        return [("UPDATE accounts SET balance = balance - %s, updated_at = %s WHERE id = %s",
                 (amount, now, src)),
                ("UPDATE accounts SET balance = balance + %s, updated_at = %s WHERE id = %s",
                 (amount, now, dst))]

    def transfer(self) -> list[Statement]:
        own = [a for a, (c, b) in self.model.accounts.items() if c is not None and b > 0]
        if len(own) < 2:
            return self.place_order()
        src, dst = self.rng.sample(sorted(own), 2)
        amount = min(self.money(), self.model.accounts[src][1])
        return self.move(src, dst, amount)

    def close_account(self) -> list[Statement]:
        own = [a for a, (c, _) in self.model.accounts.items() if c is not None]
        if not own:
            return self.place_order()
        aid = self.pick(own)
        out = self.move(aid, HOUSE, self.model.accounts[aid][1])
        del self.model.accounts[aid]
        return out + [("DELETE FROM accounts WHERE id = %s", (aid,))]

    def line(self) -> tuple[int, Decimal]:
        """A quantity and a unit price (1.00 to 499.99: the column's scale, so the amounts
        the shop stores are exactly the ones added up here)."""
        return self.rng.randint(1, 9), Decimal(self.rng.randrange(100, 50_000)).scaleb(-2)

    def write_order(self, oid: int, now: datetime) -> Statement:
        o = self.model.orders[oid]
        return ("UPDATE orders SET total = %s, line_count = %s, updated_at = %s WHERE id = %s",
                (o.total(), len(o.lines), now.replace(tzinfo=None), oid))

    def place_order(self) -> list[Statement]:
        m, now = self.model, self.now()
        if not m.customers:
            return self.new_customer()
        oid, cid = m.new_id("order"), self.pick(m.customers)
        order = m.orders[oid] = Order(cid, {n: self.line()
                                            for n in range(1, self.rng.randint(1, 5) + 1)})
        cols, vals = ["id", "customer_id", "status", "total", "line_count", "placed_at",
                      "updated_at"], [oid, cid, "placed", order.total(), len(order.lines), now,
                                      now.replace(tzinfo=None)]
        if m.has_channel:
            cols.append("channel")
            vals.append(self.rng.choice(CHANNELS))
        out = [(f"INSERT INTO orders ({', '.join(cols)}) VALUES "
                f"({', '.join(['%s'] * len(cols))})", tuple(vals))]
        for n, (qty, price) in order.lines.items():
            out.append(("INSERT INTO order_lines (order_id, line_no, sku, qty, unit_price, amount)"
                        " VALUES (%s, %s, %s, %s, %s, %s)",
                        (oid, n, self.rng.choice(SKUS), qty, price, qty * price)))
        return out

    def add_line(self) -> list[Statement]:
        if not self.model.orders:
            return self.place_order()
        now, oid = self.now(), self.pick(self.model.orders)
        order = self.model.orders[oid]
        n = max(order.lines) + 1
        qty, price = order.lines[n] = self.line()
        return [("INSERT INTO order_lines (order_id, line_no, sku, qty, unit_price, amount) "
                 "VALUES (%s, %s, %s, %s, %s, %s)",
                 (oid, n, self.rng.choice(SKUS), qty, price, qty * price)),
                self.write_order(oid, now)]

    def change_qty(self) -> list[Statement]:
        if not self.model.orders:
            return self.place_order()
        now, oid = self.now(), self.pick(self.model.orders)
        order = self.model.orders[oid]
        n = self.pick(order.lines)
        qty, price = self.rng.randint(1, 9), order.lines[n][1]
        order.lines[n] = (qty, price)
        return [("UPDATE order_lines SET qty = %s, amount = %s WHERE order_id = %s AND "
                 "line_no = %s", (qty, qty * price, oid, n)), self.write_order(oid, now)]

    def remove_line(self) -> list[Statement]:
        many = [o for o, order in self.model.orders.items() if len(order.lines) > 1]
        if not many:
            return self.add_line()
        now, oid = self.now(), self.pick(many)
        n = self.pick(self.model.orders[oid].lines)
        del self.model.orders[oid].lines[n]
        return [("DELETE FROM order_lines WHERE order_id = %s AND line_no = %s", (oid, n)),
                self.write_order(oid, now)]

    def order_status(self) -> list[Statement]:
        if not self.model.orders:
            return self.place_order()
        now, oid = self.now(), self.pick(self.model.orders)
        return [("UPDATE orders SET status = %s, updated_at = %s WHERE id = %s",
                 (self.rng.choice(STATUSES), now.replace(tzinfo=None), oid))]

    def delete_order(self) -> list[Statement]:
        if not self.model.orders:
            return self.place_order()
        oid = self.pick(self.model.orders)
        del self.model.orders[oid]
        return [("DELETE FROM order_lines WHERE order_id = %s", (oid,)),
                ("DELETE FROM orders WHERE id = %s", (oid,))]

    def rename_customer(self) -> list[Statement]:
        """Leaves the TOASTed profile as it is: decoded without its value."""
        if not self.model.customers:
            return self.new_customer()
        cid, now = self.pick(self.model.customers), self.now()
        return [("UPDATE customers SET name = %s, prefs = %s, updated_at = %s WHERE id = %s",
                 (f"customer {cid} v{self.step}", self.prefs(), now, cid))]

    def new_profile(self) -> list[Statement]:
        if not self.model.customers:
            return self.new_customer()
        cid, now = self.pick(self.model.customers), self.now()
        return [("UPDATE customers SET profile = %s, updated_at = %s WHERE id = %s",
                 (self.profile(), now, cid))]

    def rekey_customer(self) -> list[Statement]:
        """A primary-key change; the foreign keys cascade it to accounts and orders."""
        m = self.model
        if not m.customers:
            return self.new_customer()
        old, new = self.pick(m.customers), m.new_id("customer")
        m.customers.remove(old)
        m.customers.add(new)
        m.accounts = {a: (new if c == old else c, b) for a, (c, b) in m.accounts.items()}
        for order in m.orders.values():
            if order.customer_id == old:
                order.customer_id = new
        return [("UPDATE customers SET id = %s, updated_at = %s WHERE id = %s",
                 (new, self.now(), old))]

    def delete_customer(self) -> list[Statement]:
        """Their money back to the house, their accounts, orders (and lines) gone, then them."""
        m = self.model
        if len(m.customers) < 2:
            return self.new_customer()
        cid = self.pick(m.customers)
        out: list[Statement] = []
        for aid in sorted(a for a, (c, _) in m.accounts.items() if c == cid):
            out += self.move(aid, HOUSE, m.accounts[aid][1])
            del m.accounts[aid]
            out.append(("DELETE FROM accounts WHERE id = %s", (aid,)))
        for oid in sorted(o for o, order in m.orders.items() if order.customer_id == cid):
            del m.orders[oid]
            out += [("DELETE FROM order_lines WHERE order_id = %s", (oid,)),
                    ("DELETE FROM orders WHERE id = %s", (oid,))]
        m.customers.remove(cid)
        return out + [("DELETE FROM customers WHERE id = %s", (cid,))]

    def add_to_cart(self) -> list[Statement]:
        if not self.model.customers:
            return self.new_customer()
        m = self.model
        m.carts += 1
        return [("INSERT INTO carts (id, customer_id, sku, qty, added_at) VALUES "
                 "(%s, %s, %s, %s, %s)", (m.new_id("cart"), self.pick(m.customers),
                                          self.rng.choice(SKUS), self.rng.randint(1, 3),
                                          self.now()))]

    def purge_carts(self) -> list[Statement]:
        self.model.carts = 0
        return [("TRUNCATE carts", ())]

    def add_channel(self) -> list[Statement]:
        """A column added mid-stream, and values in it from this transaction on."""
        m = self.model
        if m.has_channel:
            return self.place_order()
        m.has_channel = True
        out = [("ALTER TABLE orders ADD COLUMN channel text", ())]
        for oid in sorted(m.orders)[-3:]:
            out.append(("UPDATE orders SET channel = %s WHERE id = %s",
                        (self.rng.choice(CHANNELS), oid)))
        return out

    # ---- the plan ---------------------------------------------------------------------------
    def transactions(self) -> Iterator[Txn]:
        self.step = 0
        yield Txn("setup", self.setup())
        kinds, weights = zip(*MIX, strict=True)
        for step in range(1, self.count):
            self.step = step
            kind = self.fixed.get(step) or self.rng.choices(kinds, weights)[0]
            yield Txn(kind, getattr(self, kind)())


def plan(seed: int, count: int) -> Iterator[Txn]:
    return Planner(seed, count).transactions()
