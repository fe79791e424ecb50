"""Many topics, a table each, one transaction per run (settings/routes.py): a pipeline that
reads the topics a pattern matches, named as Debezium names them (<prefix>.<schema>.<table>),
each routed to its own table with its own columns and mode; driven through the CLI."""

from __future__ import annotations

import json

from tests.helpers import (
    BOOTSTRAP,
    TEST_DB_URL,
    cli_here,
    create_topic,
    produce,
    query,
    run_cli,
    stored_offsets,
    unique,
    watermarks,
    write_config,
)


def routed_config(tmp_path, prefix: str):
    """Every topic <prefix>.public.* into <prefix>_<table>: upsert by id ([sink]), but
    order lines appended with columns of their own ([sink.topics."<prefix>.public.lines"])."""
    return write_config(tmp_path / f"{prefix}.toml", f"""
[pipeline]
name = "{prefix}"
[kafka]
bootstrap_servers = "{BOOTSTRAP}"
topic_pattern = '{prefix}\\.public\\..*'
timeout_seconds = 10
[database]
url = "{TEST_DB_URL}"
[sink]
format = "json"
table = "{{prefix}}_{{table}}"
mode = "upsert"
key = ["id"]
[sink.columns]
id = "long not null"
status = "string"
[sink.topics."{prefix}.public.lines"]
mode = "append"
columns = {{ line_id = "long not null", order_id = "long", qty = "long" }}
[spark]
master = "local[2]"
""")


def produce_orders(prefix: str) -> None:
    produce(f"{prefix}.public.orders",
            [(str(i).encode(), json.dumps({"id": i, "status": "new"}).encode())
             for i in range(10)]
            + [(str(i).encode(), json.dumps({"id": i, "status": "paid"}).encode())
               for i in range(0, 10, 2)])


def produce_lines(prefix: str) -> None:
    produce(f"{prefix}.public.lines",
            [(None, json.dumps({"line_id": j, "order_id": j // 2, "qty": j}).encode())
             for j in range(20)] + [(None, b"not json")], partition=0)


def orders(prefix: str) -> dict[int, str]:
    return dict(query(f"SELECT id, status FROM {prefix}_orders"))


def lines(prefix: str) -> list[tuple[int, int]]:
    return query(f"SELECT line_id, qty FROM {prefix}_lines ORDER BY line_id")


def dead_letters(prefix: str) -> list[tuple[str, int]]:
    return query('SELECT topic, "offset" FROM pipeline_dead_letters WHERE pipeline = %s',
                 (prefix,))


def run(config, env=None):
    if env:  # a fault: a process of its own (pipeline/faults.py reads it at import)
        return run_cli("run", "--config", str(config), env=env)
    return cli_here("run", "--config", str(config))


def test_one_run_writes_each_topics_table_in_one_transaction_and_a_crash_commits_none(
        spark, tmp_path):
    prefix = unique("rt")
    topics = [create_topic(f"{prefix}.public.{t}", n) for t, n in (("orders", 3), ("lines", 1))]
    config = routed_config(tmp_path, prefix)
    assert cli_here("init-db", "--config", str(config)).returncode == 0
    produce_orders(prefix)
    produce_lines(prefix)

    crashed = run(config, {"PIPELINE_FAULT": "before_commit:raise"})
    assert crashed.returncode != 0, crashed.stderr[-2000:]
    # Both tables were made for the topics new to the pipeline, and hold nothing of the run.
    assert orders(prefix) == {} and lines(prefix) == [] and dead_letters(prefix) == []
    assert stored_offsets(prefix) == {}

    done = run(config)
    assert done.returncode == 0, done.stderr[-2000:]
    assert f"table {prefix}_orders (upsert)" in done.stdout
    assert f"table {prefix}_lines (append)" in done.stdout
    assert orders(prefix) == {i: "paid" if i % 2 == 0 else "new" for i in range(10)}
    assert lines(prefix) == [(j, j) for j in range(20)]
    assert dead_letters(prefix) == [(f"{prefix}.public.lines", 20)]
    assert stored_offsets(prefix) == {(t, p): hi for t in topics
                                      for p, (_, hi) in watermarks(t).items()}

    # A dead letter is replayed with its topic's route, into its table.
    unrouted = cli_here("dead-letters", "replay", "--config", str(config), "--yes")
    assert unrouted.returncode == 2 and "give --topic" in unrouted.stderr, unrouted.stderr
    replay = cli_here("dead-letters", "replay", "--config", str(config), "--yes", "--topic",
                     f"{prefix}.public.lines")
    assert replay.returncode == 0, replay.stderr[-2000:]
    assert f"replayed 0 of 1 dead letters into 0 rows of {prefix}_lines; 1 still failing" in \
        replay.stdout

    # A backfill of one topic publishes into its table only: the row deleted comes back.
    assert query(f"DELETE FROM {prefix}_lines WHERE line_id = 5 RETURNING line_id") == [(5,)]
    backfill = cli_here("backfill", "--config", str(config), "--topic",
                       f"{prefix}.public.lines", "--from-offset", "0", "--to-offset", "21")
    assert backfill.returncode == 0, backfill.stderr[-2000:]
    assert lines(prefix) == [(j, j) for j in range(20)]
    assert orders(prefix) == {i: "paid" if i % 2 == 0 else "new" for i in range(10)}

    produce(f"{prefix}.public.orders", [(b"1", json.dumps({"id": 1, "status": "x"}).encode()),
                                        (b"3", json.dumps({"id": 3, "status": "x"}).encode())])
    lag = cli_here("lag", "--config", str(config), "--json")
    assert lag.returncode == 0, lag.stderr[-2000:]
    doc = json.loads(lag.stdout)
    assert {t: (v["partitions"], v["lag"]) for t, v in doc["tables"].items()} == {
        f"{prefix}_orders": (3, 2), f"{prefix}_lines": (1, 0)}
    assert {p["topic"]: p["table"] for p in doc["partitions"]} == {
        f"{prefix}.public.orders": f"{prefix}_orders", f"{prefix}.public.lines": f"{prefix}_lines"}


def test_a_topic_the_pattern_matches_later_joins_at_the_next_run_and_verify_checks_each_table(
        spark, tmp_path):
    prefix = unique("rt")
    create_topic(f"{prefix}.public.orders", 3)
    config = routed_config(tmp_path, prefix)
    assert cli_here("init-db", "--config", str(config)).returncode == 0
    produce_orders(prefix)
    first = run(config)
    assert first.returncode == 0, first.stderr[-2000:]
    assert len(orders(prefix)) == 10
    assert not query("SELECT to_regclass(%s)", (f"{prefix}_lines",))[0][0]

    # Two topics new to the pipeline, and new orders: three tables, two of them upserts
    # (each merge with its own temp tables), in the next run's one transaction.
    create_topic(f"{prefix}.public.lines", 1)
    create_topic(f"{prefix}.public.customers", 1)
    produce_lines(prefix)
    produce(f"{prefix}.public.customers",
            [(str(i).encode(), json.dumps({"id": i, "status": "vip"}).encode())
             for i in range(3)])
    produce(f"{prefix}.public.orders", [(b"4", json.dumps({"id": 4, "status": "sent"}).encode())])
    second = run(config)
    assert second.returncode == 0, second.stderr[-2000:]
    assert lines(prefix) == [(j, j) for j in range(20)]
    assert dict(query(f"SELECT id, status FROM {prefix}_customers")) == {
        0: "vip", 1: "vip", 2: "vip"}
    assert orders(prefix)[4] == "sent"

    verified = cli_here("verify", "--config", str(config))
    assert verified.returncode == 0, verified.stdout[-2000:] + verified.stderr[-2000:]
    assert (f"verified: 3 table(s) match Kafka: {prefix}_customers, {prefix}_lines, "
            f"{prefix}_orders") in verified.stdout

    assert query(f"DELETE FROM {prefix}_lines WHERE line_id = 7 RETURNING line_id") == [(7,)]
    tampered = cli_here("verify", "--config", str(config))
    assert tampered.returncode == 3, tampered.stderr[-2000:]
    error = tampered.stderr.strip().splitlines()[-1]
    assert f"table(s) {prefix}_lines of pipeline" in error and "MISMATCH" in error
    assert f"{prefix}_orders" not in error and f"{prefix}_customers" not in error
