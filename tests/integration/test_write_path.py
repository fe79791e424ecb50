"""The write path: COPY text built in Spark SQL, staged as blobs per task attempt, streamed
into the keyed results table in the publishing transaction. Exact values, exact UTC, and a
retried task counted once."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from decimal import Decimal

from confluent_kafka import Producer

from tests.helpers import (
    BOOTSTRAP,
    cli_here,
    create_topic,
    init_cli,
    produce_orders,
    query,
    result_keys,
    run_cli,
    stored_offsets,
    toml_config,
    unique,
    watermarks,
)


def config_for(tmp_path, name: str, topic: str, *, fmt: str = "json",
               master: str = "local[2]") -> str:
    path = tmp_path / f"{name}.toml"
    path.write_text(toml_config(name, [topic], fmt=fmt).replace(
        'master = "local[2]"', f'master = "{master}"'))
    init_cli(path)
    return str(path)


def kafka_keys(topic: str) -> list[tuple[str, int, int]]:
    return [(topic, p, o) for p, (lo, hi) in sorted(watermarks(topic).items())
            for o in range(lo, hi)]


def test_task_retried_after_its_staging_commit_is_published_and_counted_once(stack, tmp_path):
    topic = create_topic(unique("retry"), 2)
    produce_orders(topic, range(300), partition=0)
    produce_orders(topic, range(300, 600), partition=1)
    name = unique("retry")
    # local[2,2]: Spark retries a failed task once. Every task's first attempt fails right
    # after committing its staged blobs, so each Spark partition is staged twice.
    config = config_for(tmp_path, name, topic, master="local[2,2]")
    proc = run_cli("run", "--config", config, "--json",
                   env={"PIPELINE_FAULT": "after_task_commit:raise"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "injected fault at after_task_commit" in proc.stderr  # the fault really fired
    summary = json.loads(proc.stdout)
    assert summary["records_read"] == 600
    assert summary["rows_written"] == 600
    assert {k: v["rows"] for k, v in summary["per_partition"].items()} == {
        f"{topic}[0]": 300, f"{topic}[1]": 300}
    assert result_keys(name) == kafka_keys(topic)
    assert query(f"SELECT sum(order_id), count(DISTINCT order_id) FROM {name}") == [
        (sum(range(600)), 600)]
    run_row = query("SELECT records_read, rows_written, per_partition FROM pipeline_runs "
                    "WHERE pipeline = %s AND status = 'succeeded'", (name,))
    assert run_row[0][:2] == (600, 600)
    assert stored_offsets(name) == {(topic, 0): 300, (topic, 1): 300}
    # The ledger holds the published attempts' ranges once: no range twice, none missing.
    assert query('SELECT "partition", sum(records), sum(rows_written), count(*), '
                 "count(DISTINCT from_offset) FROM pipeline_ranges WHERE pipeline = %s "
                 "GROUP BY 1 ORDER BY 1", (name,)) == [(0, 300, 300, 1, 1), (1, 300, 300, 1, 1)]


def test_timestamps_are_exact_utc_whatever_the_os_time_zone(stack, tmp_path):
    """The whole job (driver and executors) in America/New_York, records around the DST
    change of 2026-03-08 (02:00 local -> 03:00, i.e. 07:00Z)."""
    # Kept forever: the broker's time-based retention would delete these old timestamps.
    topic = create_topic(unique("tz"), 1, **{"retention.ms": "-1"})
    instants = [datetime(2026, 3, 8, 6, 59, 59, 500000, tzinfo=UTC),
                datetime(2026, 3, 8, 7, 0, tzinfo=UTC),
                datetime(2026, 3, 8, 7, 30, 0, 123456, tzinfo=UTC),
                datetime(2026, 11, 1, 5, 30, tzinfo=UTC),  # the autumn fold: 01:30 twice
                datetime(2026, 11, 1, 6, 30, tzinfo=UTC)]
    p = Producer({"bootstrap.servers": BOOTSTRAP})
    for i, at in enumerate(instants):
        # The JSON carries the instant with a New York offset; Kafka's timestamp is epoch ms.
        local = at.astimezone(__import__("zoneinfo").ZoneInfo("America/New_York"))
        value = json.dumps({"order_id": i, "customer": "c", "amount": 1,
                            "placed_at": local.isoformat()}).encode()
        p.produce(topic, value=value, timestamp=int(at.timestamp() * 1000) - i)
    assert p.flush(30) == 0
    name = unique("tz")
    config = config_for(tmp_path, name, topic)
    proc = run_cli("run", "--config", config, env={"TZ": "America/New_York"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = query(f'SELECT order_id, placed_at, kafka_timestamp FROM {name} ORDER BY order_id')
    assert [r[1] for r in rows] == instants
    # Kafka timestamps have millisecond precision.
    assert [r[2] for r in rows] == [
        datetime.fromtimestamp((int(at.timestamp() * 1000) - i) / 1000, UTC)
        for i, at in enumerate(instants)]


def test_strings_bytes_and_headers_round_trip_exactly(spark, tmp_path):
    """Everything COPY text format escapes, plus what it must not touch."""
    topic = create_topic(unique("esc"), 1)
    tricky = ["tab\there", "new\nline", "cr\rlf\r\n", "back\\slash", "\\N", "", " padded ",
              'quote " and \' and ,', "unicode é 漢字 🎉", "\\x41", "end\\"]
    headers = [("h\tkey", b"\x00\xff\t\n\\"), ("plain", b"v")]
    p = Producer({"bootstrap.servers": BOOTSTRAP})
    for i, text in enumerate(tricky):
        p.produce(topic, key=f"\t{i}\\".encode(), headers=headers, value=json.dumps(
            {"order_id": i, "customer": text, "amount": 12.5}).encode())
    assert p.flush(30) == 0
    json_name, raw_name = unique("escj"), unique("escr")
    for name, fmt in ((json_name, "json"), (raw_name, "raw")):
        proc = cli_here("run", "--config", config_for(tmp_path, name, topic, fmt=fmt))
        assert proc.returncode == 0, proc.stderr[-3000:]
    assert [r[0] for r in query(f"SELECT customer FROM {json_name} ORDER BY order_id")] \
        == tricky
    assert query(f"SELECT DISTINCT amount FROM {json_name}") == [(Decimal("12.50"),)]
    raw = query(f'SELECT key, value, headers FROM {raw_name} ORDER BY "offset"')
    assert [bytes(r[0]) for r in raw] == [f"\t{i}\\".encode() for i in range(len(tricky))]
    assert [json.loads(bytes(r[1]))["customer"] for r in raw] == tricky
    import base64
    assert [(h["key"], base64.b64decode(h["value_b64"])) for h in raw[0][2]] == headers


def test_rerun_over_rows_already_present_keeps_them_and_adds_the_rest(spark, tmp_path):
    """The publish writes straight into the keyed table only where the planned ranges hold
    no rows yet; otherwise it merges with ON CONFLICT DO NOTHING, keeping the old rows."""
    topic = create_topic(unique("merge"), 1)
    produce_orders(topic, range(50))
    name = unique("merge")
    config = config_for(tmp_path, name, topic)
    # A backfill lands [10, 20) first, as an operator might before the first ingest.
    proc = cli_here("backfill", "--config", config, "--topic", topic, "--partition", "0",
                   "--from-offset", "10", "--to-offset", "20")
    assert proc.returncode == 0, proc.stderr[-3000:]
    first = query(f'SELECT "offset", run_id FROM {name} ORDER BY 1')
    assert [o for o, _ in first] == list(range(10, 20))
    proc = cli_here("run", "--config", config, "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads(proc.stdout)
    assert summary["records_read"] == 50 and summary["rows_written"] == 40
    rows = query(f'SELECT "offset", run_id FROM {name} ORDER BY 1')
    assert [o for o, _ in rows] == list(range(50))
    assert [r for r in rows if 10 <= r[0] < 20] == first  # the backfill's rows were kept
    assert stored_offsets(name) == {(topic, 0): 50}
