"""The example transform's dimension extract (conf/examples/transforms/customers.csv): one
row per customer, a duplicate refused naming it, never one row picked at random. No Spark."""

import importlib.util
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location(
    "order_enrichment", ROOT / "conf/examples/transforms/order_enrichment.py")
order_enrichment = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(order_enrichment)


def test_the_shipped_extract_has_one_row_per_customer():
    rows = order_enrichment.customer_rows()
    assert rows and len({r[0] for r in rows}) == len(rows)


def test_a_customer_twice_in_the_extract_is_refused_naming_it_and_its_lines(tmp_path):
    csv = tmp_path / "customers.csv"
    csv.write_text("customer,region,segment\nc0,north,business\nc1,south,consumer\n"
                   "c0,west,consumer\n")
    with pytest.raises(ValueError, match=r"^customers.csv: customer 'c0' is on lines 2 and 4; "
                                         r"keep one row per customer$"):
        order_enrichment.customer_rows(csv)
