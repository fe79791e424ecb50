"""A run with a transform runs its job without Spark's per-row Arrow batch-size check and
its JVM with Arrow Java's bounds and null checks on (spark/arrow_settings.py);
a user's own byte cap wins, the session gets its settings back after the run; records too
big for batches bounded by rows alone (1-2 MB each, or as big as Kafka's default largest
message in a small driver) make the job run again bounded by bytes, and arrive exactly."""

from __future__ import annotations

import hashlib
import json
from decimal import Decimal

import pytest
from confluent_kafka import Producer

from pipeline.driver.job import run_ingest
from pipeline.spark.arrow_settings import MAX_BYTES_PER_BATCH, UNCHECKED_BYTES
from tests.helpers import (
    BOOTSTRAP,
    create_topic,
    init_cli,
    init_db,
    make_settings,
    produce,
    produce_orders,
    query,
    run_cli,
    toml_config,
    unique,
    write_config,
)
from tests.integration.transforms import orders

PROBE = "tests.integration.transforms.orders:arrow_probe"
IDENTITY = "tests.integration.transforms.orders:identity"


def sparse_order(i: int) -> bytes:
    """An order whose nullable columns are null in some records: each must come through as
    null."""
    return json.dumps({"order_id": i, "customer": f"c{i}",
                       "amount": None if i % 3 == 0 else i * 1.25,
                       **({"placed_at": f"2026-03-08T06:{i:02d}:00Z"} if i % 2 else {})}
                      ).encode()


@pytest.mark.slow
def test_a_transforms_job_runs_without_the_row_check_and_its_jvm_with_arrows_checks(
        stack, tmp_path):
    name = unique("arrow_cli")
    create_topic(name, partitions=2)
    produce(name, [(f"k{i}".encode(), sparse_order(i)) for i in range(40)])
    config = write_config(tmp_path / "p.toml", toml_config(
        name, [name], extra_sink=f'transform = "{PROBE}"') + "class_archive = false\n")
    init_cli(config)
    probe = tmp_path / "probe.json"

    proc = run_cli("run", "--config", str(config), env={"TEST_ARROW_PROBE": str(probe)})

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(probe.read_text()) == {
        "maxBytesPerBatch": UNCHECKED_BYTES, "arrow.enable_unsafe_memory_access": None,
        "arrow.enable_null_check_for_get": None}
    assert query(f"SELECT count(*), count(amount), sum(amount), count(placed_at), "
                 f"sum(extract(minute FROM placed_at)) FROM {name}") == [
        (40, 26, Decimal(str(sum(i * 1.25 for i in range(40) if i % 3))), 20,
         Decimal(sum(range(1, 40, 2))))]


@pytest.mark.slow
def test_a_users_byte_cap_in_spark_conf_reaches_the_transforms_job(stack, tmp_path):
    name = unique("arrow_cap_cli")
    create_topic(name, partitions=1)
    produce_orders(name, range(10))
    config = write_config(tmp_path / "p.toml", toml_config(
        name, [name], extra_sink=f'transform = "{PROBE}"') + "class_archive = false\n"
        f'[spark.conf]\n"{MAX_BYTES_PER_BATCH}" = "1048576"\n')
    init_cli(config)
    probe = tmp_path / "probe.json"

    proc = run_cli("run", "--config", str(config), env={"TEST_ARROW_PROBE": str(probe)})

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert json.loads(probe.read_text())["maxBytesPerBatch"] == "1048576"
    assert query(f"SELECT count(*) FROM {name}") == [(10,)]


def test_a_users_byte_cap_wins_and_the_session_gets_its_value_back(spark):
    topic = create_topic(unique("arrow_cap"), 1)
    produce_orders(topic, range(10))
    before = spark.conf.get(MAX_BYTES_PER_BATCH)
    ours = init_db(make_settings(unique("arrow_ours"), [topic], sink={"transform": PROBE}))
    mine = init_db(make_settings(unique("arrow_mine"), [topic], sink={"transform": PROBE},
                                 spark={"conf": {MAX_BYTES_PER_BATCH: "1048576"}}))
    orders.ARROW_SEEN.clear()

    assert run_ingest(ours).status == "succeeded"
    assert spark.conf.get(MAX_BYTES_PER_BATCH) == before
    assert run_ingest(mine).status == "succeeded"

    # this process's JVM is up already: the user's value is Spark's to apply, not ours
    assert [s["maxBytesPerBatch"] for s in orders.ARROW_SEEN] == [UNCHECKED_BYTES, before]
    assert spark.conf.get(MAX_BYTES_PER_BATCH) == before
    for s in (ours, mine):
        assert query(f"SELECT count(*) FROM {s.sink.table}") == [(10,)]


def big_order(i: int) -> bytes:
    """An order whose customer is 1-2 MB, distinct for each record."""
    size = 1_000_000 + (i * 7919) % 1_000_000
    customer = f"{i}:" + ("abcdefghijklmnopqrstuvwxyz" * (size // 26 + 1))[:size]
    return json.dumps({"order_id": i, "customer": customer, "amount": i / 4}).encode()


@pytest.mark.slow
def test_records_of_one_to_two_mb_arrive_exactly_through_row_bounded_batches(spark):
    n = 160
    topic = create_topic(unique("arrow_big"), 2, **{"max.message.bytes": "3000000"})
    p = Producer({"bootstrap.servers": BOOTSTRAP, "message.max.bytes": 3_000_000,
                  "enable.idempotence": True, "linger.ms": 5})
    for i in range(n):
        p.produce(topic, key=f"k{i}".encode(), value=big_order(i), partition=i % 2)
        p.poll(0)
    assert p.flush(60) == 0
    settings = init_db(make_settings(unique("arrow_big"), [topic],
                                     sink={"transform": IDENTITY}))

    assert run_ingest(settings).status == "succeeded"

    got = query(f"SELECT order_id, length(customer), md5(customer), amount FROM "
                f"{settings.sink.table} ORDER BY order_id")
    want = []
    for i in range(n):
        customer = json.loads(big_order(i))["customer"]
        want.append((i, len(customer), hashlib.md5(customer.encode()).hexdigest(), i / 4))
    assert [(a, b, c, float(d)) for a, b, c, d in got] == want
    assert query("SELECT sum(records), sum(rows_written) FROM pipeline_ranges WHERE "
                 "pipeline = %s", (settings.name,)) == [(n, n)]


@pytest.mark.slow
def test_records_of_kafkas_largest_default_size_go_through_a_transform_in_a_small_driver(
        stack, tmp_path):
    # Records just under Kafka's default largest message (message.max.bytes, ~1 MB), all on
    # one partition, through an identity transform in a 512 MB driver JVM: with batches
    # bounded by rows alone, the writer's one batch of all 300 outgrew the JVM's direct
    # memory (Arrow's OutOfMemoryException, exit 1 on every run, nothing committed). The
    # read tasks stop the row-bounded job at their first batch; it runs again by bytes.
    n, size = 300, 990_000
    name = unique("arrow_max_message")
    create_topic(name, partitions=1)
    p = Producer({"bootstrap.servers": BOOTSTRAP, "enable.idempotence": True,
                  "linger.ms": 5})
    for i in range(n):
        customer = f"{i}:" + chr(97 + i % 26) * size
        p.produce(name, key=f"k{i}".encode(), value=json.dumps(
            {"order_id": i, "customer": customer, "amount": i}).encode())
        p.poll(0)
    assert p.flush(60) == 0
    config = write_config(tmp_path / "p.toml", toml_config(
        name, [name], extra_sink=f'transform = "{IDENTITY}"')
        + '[spark.conf]\n"spark.driver.memory" = "512m"\n')
    init_cli(config)

    proc = run_cli("run", "--config", str(config))

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "runs again with its Arrow batches bounded by bytes" in proc.stderr
    assert query(f"SELECT count(*), sum(order_id), sum(length(customer)), "
                 f"count(DISTINCT left(customer, 6)) FROM {name}") == [
        (n, sum(range(n)), sum(len(f"{i}:") + size for i in range(n)), n)]
