"""The example configs (conf/examples/*.toml) run as their comments and the README say,
each pointed at a fresh topic, table and pipeline name: upsert, aggregate, and the
transform example through the CLI with its folder on PYTHONPATH."""

from __future__ import annotations

import csv
import json
from decimal import Decimal

from pipeline.config import load_settings
from pipeline.driver.job import run_ingest
from tests.helpers import (
    BOOTSTRAP,
    ROOT,
    TEST_DB_URL,
    create_topic,
    init_cli,
    init_db,
    job_db_url,
    produce,
    query,
    run_cli,
    unique,
)


def test_the_example_configs_run_as_documented(spark, tmp_path):
    """conf/examples/*.toml, pointed at a fresh topic, table and pipeline name."""
    from dataclasses import replace

    from pipeline.config import with_overrides

    def example(path: str, topic: str):
        s = load_settings(path, environ={})
        name = unique(s.name[:10])
        s = replace(with_overrides(s, topics=(topic,), bootstrap_servers=BOOTSTRAP), name=name,
                    database_url=TEST_DB_URL,
                    sink=replace(s.sink, table=name))
        return init_db(s)

    topic = create_topic(unique("ex"), 2)
    produce(topic, [(b"1", b'{"order_id": 1, "customer": "a", "status": "placed"}'),
                    (b"2", b'{"order_id": 2, "customer": "b", "status": "placed"}'),
                    (b"1", b'{"order_id": 1, "customer": "a", "status": "shipped"}'),
                    (b"2", None)])
    upsert = example("conf/examples/upsert.toml", topic)
    result = run_ingest(upsert)
    assert (result.rows_written, result.rows_deleted) == (1, 0)  # 2 was deleted in-run
    assert query(f"SELECT order_id, status FROM {upsert.sink.table}") == [(1, "shipped")]
    assert query(f"SELECT order_id FROM {upsert.sink.table}_deleted") == [(2,)]

    topic = create_topic(unique("ex"), 2)
    produce(topic, [(b"a", json.dumps({"customer": "a", "day": d, "amount": amount,
                                       "placed_at": f"{d}T10:00:00Z"}).encode())
                    for d, amount in [("2026-01-01", "1.50"), ("2026-01-01", None),
                                      ("2026-01-02", "2.25"), ("2026-01-01", "3.00")]])
    totals = example("conf/examples/aggregate.toml", topic)
    run_ingest(totals)
    assert query(f"SELECT customer, day::text, orders, total_amount, priced_orders, biggest "
                 f"FROM {totals.sink.table} ORDER BY day") == [
        ("a", "2026-01-01", 3, Decimal("4.50"), 2, Decimal("3.00")),
        ("a", "2026-01-02", 1, Decimal("2.25"), 1, Decimal("2.25"))]

    run_transform_example(tmp_path)


def run_transform_example(tmp_path) -> None:
    """conf/examples/transform.toml as its comment says to run it: the sample producer's
    orders, the CLI with its transform's folder on PYTHONPATH (relative, from the checkout),
    against a copy pointed at a fresh topic, table and pipeline name. The table must hold
    the transform recomputed here: good orders with an amount > 0, joined with
    customers.csv, banded."""
    from pipeline import sample

    name = unique("exte")
    topic = create_topic(name, 2)
    sample.produce(BOOTSTRAP, topic, 300, bad_every=50, partitions=2)  # 6 bad
    text = (ROOT / "conf/examples/transform.toml").read_text()
    for old, new in [('name = "enriched_orders"', f'name = "{name}"'),
                     ('table = "enriched_orders"', f'table = "{name}"'),
                     ('topics = ["orders"]', f'topics = ["{topic}"]'),
                     ('"127.0.0.1:9092"', f'"{BOOTSTRAP}"'),
                     ('"postgresql://postgres@127.0.0.1:5433/pipeline"', f'"{job_db_url()}"')]:
        assert old in text, old
        text = text.replace(old, new)
    config = tmp_path / "transform.toml"
    config.write_text(text)
    init_cli(config)
    r = run_cli("run", "--config", str(config), "--json",
                env={"PYTHONPATH": "conf/examples/transforms"})
    assert r.returncode == 0, r.stderr[-2000:]
    summary = json.loads(r.stdout)
    assert sum(r["until"] - r["from"] for r in summary["plan"]) == 300, summary
    # Every record read is counted, the one the transform filtered out too.
    assert (summary["records_read"], summary["rows_written"], summary["dead_letters"]) == \
        (300, 293, 6), summary
    [(per_partition,)] = query("SELECT per_partition FROM pipeline_runs WHERE pipeline = %s "
                               "AND status = 'succeeded'", (name,))
    assert sum(v.get("filtered", 0) for v in per_partition.values()) == 1, per_partition

    with (ROOT / "conf/examples/transforms/customers.csv").open() as f:
        dimension = {row["customer"]: (row["region"], row["segment"])
                     for row in csv.DictReader(f)}
    want = {}
    for i in range(300):
        if i % 50 == 49:  # the sample's bad records
            continue
        doc = json.loads(sample.order(i))
        amount = Decimal(str(doc["amount"]))
        if amount > 0:
            band = "small" if amount < 1000 else "medium" if amount < 10000 else "large"
            want[i] = (*dimension.get(doc["customer"], ("unknown", None)), band, amount)
    got = {r[0]: tuple(r[1:]) for r in query(
        f"SELECT order_id, region, segment, amount_band, amount FROM {name}")}
    assert got == want and len(got) == 293
    assert {v[0] for v in got.values()} == {"north", "south", "east", "west", "unknown"}
