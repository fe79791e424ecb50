"""Nested JSON through the real stack, with conf/examples/nested.toml as documented (pointed
at a fresh topic, table and pipeline name): camelCase keys and nested paths (``from``),
jsonb sub-documents and array columns land exactly as produced, in typed Postgres columns
(jsonb, text[], bigint[], numeric[]); records with a wrong type at a path or in an array
element, a path through a non-object, or a missing required path are dead letters naming
the path and column, a bare Infinity (not JSON) one saying so. Two runs with records
produced in between, then a run with nothing new; the table equals the records, nothing
twice."""

from __future__ import annotations

import json
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from pipeline.config import load_settings, with_overrides
from pipeline.driver.job import run_ingest
from tests.helpers import (
    BOOTSTRAP,
    ROOT,
    TEST_DB_URL,
    create_topic,
    init_db,
    produce,
    query,
    stored_offsets,
    unique,
    watermarks,
)

pytestmark = pytest.mark.integration

EPOCH = datetime(2026, 1, 2, tzinfo=UTC)
TWO_PLACES = Decimal("0.01")


def order(i: int) -> dict:
    """A record with every shape the example's columns meet: paths present, absent or null
    on the way, empty arrays, nulls inside arrays, text that needs escaping."""
    doc: dict = {"orderId": i, "placedAt": (EPOCH + timedelta(minutes=i)).isoformat()}
    if i % 5:
        doc["customer"] = {"id": 1000 + i, "name": f'c"{i}\\\t\n', "vip": i % 2 == 0}
        if i % 3:
            doc["customer"]["address"] = {"city": f"Zürich {i}", "zip": None}
    elif i % 10 == 0:
        doc["customer"] = None  # a null on the way: customer_id and city are NULL
    doc["lines"] = [{"sku": f"S-{i}-{n}", "qty": n} for n in range(i % 3)]
    doc["tags"] = [f"t{i}", None, 'q"uote\\', "tab\there"][: i % 5]
    doc["quantities"] = [n * i for n in range(i % 4)] + ([None] if i % 7 == 0 else [])
    doc["prices"] = [round(i + 0.25 * n, 2) for n in range(i % 3)]
    return doc


# Bad records: (what is wrong, the change, the dead letter's type and message).
BAD = {
    7: ({"quantities": [1, "two"]}, "wrong_type",
        "field 'quantities': expected array<long>, got array: element [1] is string"),
    13: ({"customer": "Ann"}, "wrong_type",
         "field 'customer.id' (column customer_id): 'customer' is JSON string, not an object"),
    29: ({"orderId": None}, "missing_field",
         "required field 'orderId' (column order_id) is missing or null"),
    31: ({"customer": {"id": "1031"}}, "wrong_type",
         "field 'customer.id' (column customer_id): expected long, got string"),
    37: ({"tags": "just-one"}, "wrong_type",
         "field 'tags': expected array<string>, got string"),
    41: ({"prices": [1.5, 123456789.5]}, "wrong_type",
         "field 'prices': expected array<decimal(10,2)>, got array: element [1] is double"),
    # Not JSON: jsonb parses with the standard library, which reads Infinity (it was null).
    43: ({"lines": [{"sku": "s", "qty": float("inf")}]}, "malformed_json",
         "value holds NaN or Infinity as a bare number, which JSON does not allow (a double "
         "column reads the string \"NaN\")"),
}


def value(i: int) -> dict:
    doc = order(i)
    bad = BAD.get(i % 50)
    if bad:
        doc.update(bad[0])
    return doc


def expected_row(doc: dict) -> tuple:
    """The row a good record must become, as psycopg reads it back."""
    customer = doc.get("customer")
    return (doc["orderId"], datetime.fromisoformat(doc["placedAt"]),
            customer["id"] if customer else None,
            (customer.get("address") or {}).get("city") if customer else None,
            customer if "customer" in doc else None, doc["lines"], doc["tags"],
            doc["quantities"], [Decimal(str(p)).quantize(TWO_PLACES) for p in doc["prices"]])


SELECT = ("order_id, placed_at, customer_id, city, customer, lines, tags, quantities, prices")


def test_nested_paths_camel_case_jsonb_and_arrays_land_exactly_and_bad_ones_are_dead(spark):
    topic = create_topic(unique("nested"), 2)
    name = unique("nested")
    s = load_settings(ROOT / "conf/examples/nested.toml", environ={})
    s = init_db(replace(with_overrides(s, topics=(topic,), bootstrap_servers=BOOTSTRAP),
                        name=name, database_url=TEST_DB_URL, sink=replace(s.sink, table=name)))
    assert dict(query(
        "SELECT column_name, udt_name FROM information_schema.columns WHERE table_name = %s "
        "AND column_name IN ('customer', 'lines', 'tags', 'quantities', 'prices')",
        (name,))) == {"customer": "jsonb", "lines": "jsonb", "tags": "_text",
                      "quantities": "_int8", "prices": "_numeric"}

    produced: dict[int, dict] = {}

    def send(ids) -> None:
        records = []
        for i in ids:
            produced[i] = value(i)
            records.append((str(i).encode(), json.dumps(produced[i]).encode()))
        produce(topic, records)

    send(range(0, 200))
    first = run_ingest(s)
    send(range(200, 300))
    second = run_ingest(s)
    again = run_ingest(s)

    bad = {i for i in produced if i % 50 in BAD}
    assert (first.records_read + second.records_read, again.records_read) == (300, 0)
    assert first.rows_written + second.rows_written == 300 - len(bad)
    assert first.dead_letters + second.dead_letters == len(bad)
    rows = {r[0]: r for r in query(f"SELECT {SELECT} FROM {name}")}
    assert rows == {i: expected_row(doc) for i, doc in produced.items() if i not in bad}

    # Each dead letter names its path and column; its value is the record as produced.
    dead = query("SELECT key, value, error_type, error_message FROM pipeline_dead_letters "
                 "WHERE pipeline = %s", (name,))
    assert sorted((int(bytes(k)), json.loads(bytes(v)), t, m) for k, v, t, m in dead) == [
        (i, produced[i], BAD[i % 50][1], BAD[i % 50][2]) for i in sorted(bad)]
    assert stored_offsets(name) == {(topic, p): hi for p, (_, hi) in watermarks(topic).items()}
