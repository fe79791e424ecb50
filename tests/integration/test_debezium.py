"""Debezium change events through the real stack ([sink] envelope = "debezium", an upsert
sink): a generated stream of snapshot reads, creates, updates and deletes (half of the
deletes followed by their tombstone, as Debezium writes them by default) over 150 keys,
half the keys' events in Kafka Connect's schema envelope (timestamps as epoch
milliseconds, decimals as base64 bytes) and half without (ISO strings, decimal strings),
read in two runs with events produced in between: the table equals the source table's
final state; a replay of every range from offset 0 changes nothing (not one row
rewritten). And a table keyed by a date, a timestamp and a decimal: its deletes and
tombstones, keys in the schema envelope, delete the rows their creates wrote."""

from __future__ import annotations

import base64
import json
import random
from datetime import UTC, datetime, timedelta
from decimal import Decimal

import pytest

from pipeline.driver.backfill import run_backfill
from pipeline.driver.job import run_ingest
from pipeline.errors import DataError
from pipeline.plan.offsets import OffsetRange
from tests.helpers import (
    BOOTSTRAP,
    cli_here,
    create_topic,
    init_db,
    make_settings,
    produce,
    query,
    run_cli,
    stored_offsets,
    unique,
    watermarks,
)

pytestmark = pytest.mark.integration

COLUMNS = {"id": "long not null", "name": "string", "updated_at": "timestamp",
           "price": "decimal(10,2)", "city": {"type": "string", "from": "address.city"}}
T0 = datetime(2026, 3, 1, tzinfo=UTC)
FIELDS = [{"field": "id", "type": "int64"}, {"field": "name", "type": "string"},
          {"field": "updated_at", "type": "int64", "name": "io.debezium.time.Timestamp"},
          {"field": "price", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
           "parameters": {"scale": "2"}},
          {"field": "address", "type": "struct", "fields": [{"field": "city",
                                                              "type": "string"}]}]
SCHEMA = {"type": "struct", "name": "shop.orders.Envelope", "fields": [
    {"field": "before", "type": "struct", "fields": FIELDS},
    {"field": "after", "type": "struct", "fields": FIELDS},
    {"field": "op", "type": "string"}]}
KEY_SCHEMA = {"type": "struct", "fields": [{"field": "id", "type": "int64"}]}


def image(row: dict, envelope: bool) -> dict:
    """A source row as Debezium's JSON converter writes it."""
    if not envelope:
        return {**row, "updated_at": row["updated_at"].isoformat(), "price": str(row["price"])}
    cents = int(row["price"] * 100)
    return {**row, "updated_at": int(row["updated_at"].timestamp() * 1000),
            "price": base64.b64encode(cents.to_bytes(8, "big", signed=True)).decode()}


def record(k: int, op: str, before: dict | None, after: dict | None,
           envelope: bool) -> tuple[bytes, bytes]:
    payload = {"before": before and image(before, envelope),
               "after": after and image(after, envelope), "op": op,
               "source": {"connector": "postgresql", "table": "orders"}, "ts_ms": 0}
    key = {"id": k}
    if envelope:
        payload = {"schema": SCHEMA, "payload": payload}
        key = {"schema": KEY_SCHEMA, "payload": key}
    return json.dumps(key).encode(), json.dumps(payload).encode()


def stream(rng: random.Random, state: dict[int, dict], n: int, start: int) -> list:
    """n change events against ``state`` (the source table), which they update."""
    out = []
    for step in range(start, start + n):
        k = rng.randrange(150)
        # One converter setting per key: its Kafka key's bytes, so its partition, stay the
        # same (a connector writes a topic with one setting; both kinds share one here).
        envelope = k % 2 == 0
        row = {"id": k, "name": f"n{k}-{step}\t\"x\"",
               "updated_at": T0 + timedelta(milliseconds=7 * step),
               "price": Decimal(rng.randrange(-10**6, 10**6)).scaleb(-2),
               "address": {"city": f"c{step % 9}"} if step % 4 else None}
        old = state.get(k)
        if old is None:
            op = "r" if start == 0 and step < 50 else "c"
            out.append((k, record(k, op, None, row, envelope)))
            state[k] = row
        elif rng.random() < 0.75:
            out.append((k, record(k, "u", old, row, envelope)))
            state[k] = row
        else:
            out.append((k, record(k, "d", old, None, envelope)))
            if rng.random() < 0.5:  # its tombstone (unless tombstones.on.delete = false)
                out.append((k, (record(k, "d", old, None, envelope)[0], None)))
            del state[k]
    return [r for _, r in out]


def expected(state: dict[int, dict]) -> list[tuple]:
    return sorted((k, r["name"], r["updated_at"], r["price"],
                   (r["address"] or {}).get("city")) for k, r in state.items())


def test_a_debezium_stream_lands_as_the_source_tables_final_state_and_a_replay_is_a_noop(
        spark):
    rng = random.Random(26)
    name = unique("dbz")
    topic = create_topic(name, 2)
    settings = init_db(make_settings(name, [topic], sink={
        "envelope": "debezium", "mode": "upsert", "key": ["id"], "columns": COLUMNS}))
    state: dict[int, dict] = {}
    select = f"SELECT id, name, updated_at, price, city FROM {name} ORDER BY id"

    produce(topic, stream(rng, state, 400, 0))
    first = run_ingest(settings)
    assert first.dead_letters == 0
    assert query(select) == expected(state)

    produce(topic, stream(rng, state, 400, 400))
    second = run_ingest(settings)
    assert second.dead_letters == 0 and second.rows_deleted > 0
    assert query(select) == expected(state)
    ends = {p: hi for p, (_, hi) in watermarks(topic).items()}
    assert stored_offsets(name) == {(topic, p): hi for p, hi in ends.items()}

    # A replay of every range from offset 0 (a backfill): not one row or deletion written.
    def snapshot() -> tuple:
        return (query(f"SELECT *, xmin::text FROM {name} ORDER BY id"),
                query(f"SELECT *, xmin::text FROM {name}_deleted ORDER BY id"))

    before = snapshot()
    replay = run_backfill(settings, [OffsetRange(topic, p, 0, hi) for p, hi in ends.items()])
    assert replay.records_read == sum(ends.values())
    assert (replay.rows_written, replay.rows_deleted, replay.dead_letters) == (0, 0, 0)
    assert snapshot() == before
    assert query(select) == expected(state)


def test_deletes_of_rows_keyed_by_a_date_a_timestamp_and_a_decimal_delete_them(spark):
    # Key and value in the schema envelope: the key is decoded by its own schema as the
    # images are (before: still days, microseconds, base64, so every delete a dead letter).
    key_fields = [{"field": "day", "type": "int32", "name": "io.debezium.time.Date"},
                  {"field": "at", "type": "int64", "name": "io.debezium.time.MicroTimestamp"},
                  {"field": "ref", "type": "bytes", "name": "org.apache.kafka.connect.data.Decimal",
                   "parameters": {"scale": "2"}}]
    fields = key_fields + [{"field": "n", "type": "string"}]
    schema = {"type": "struct", "fields": [{"field": i, "type": "struct", "fields": fields}
                                           for i in ("before", "after")]}

    def key_of(k: int) -> dict:
        return {"day": 19_000 + k, "at": 1_700_000_000_000_000 + k,
                "ref": base64.b64encode((1234 + k).to_bytes(4, "big", signed=True)).decode()}

    def enveloped(fields_or_schema, payload) -> bytes:
        return json.dumps({"schema": fields_or_schema, "payload": payload}).encode()

    def change(k: int, op: str, before: dict | None, after: dict | None) -> bytes:
        return enveloped(schema, {"before": before, "after": after, "op": op})

    creates, deletes = [], []
    for k in range(6):
        key = enveloped({"type": "struct", "fields": key_fields}, key_of(k))
        row = {**key_of(k), "n": f"n{k}"}
        creates.append((key, change(k, "c", None, row)))
        if k < 4:  # deleted: by its before image (0, 1, 2, and 0, 1 tombstoned), by its key (3)
            deletes.append((key, change(k, "d", row if k < 3 else None, None)))
            if k < 2:
                deletes.append((key, None))
    name = unique("dbzkeys")
    topic = create_topic(name, 1)
    settings = init_db(make_settings(name, [topic], sink={
        "envelope": "debezium", "mode": "upsert", "key": ["day", "at", "ref"],
        "columns": {"day": "date not null", "at": "timestamp not null",
                    "ref": "decimal(8,2) not null", "n": "string"}}))
    select = f"SELECT day::text, at, ref, n FROM {name} ORDER BY n"

    def rows(ks) -> list[tuple]:
        return [(f"2022-01-{8 + k:02d}", datetime(2023, 11, 14, 22, 13, 20, k, tzinfo=UTC),
                 Decimal(1234 + k).scaleb(-2), f"n{k}") for k in ks]

    produce(topic, creates)
    assert run_ingest(settings).rows_written == 6 and query(select) == rows(range(6))
    produce(topic, deletes)  # in a later run: the rows are in the table to delete
    result = run_ingest(settings)
    assert (result.dead_letters, result.rows_deleted) == (0, 4)
    assert query(select) == rows((4, 5))


# ---- change events as real sources send them (CLI) ---------------------------------------

UNAVAILABLE = "__debezium_unavailable_value"  # Debezium's unavailable.value.placeholder
UNAVAILABLE_BYTES = base64.b64encode(UNAVAILABLE.encode()).decode()  # a bytea column's form


def dbz_config(tmp_path, name: str, topics: list[str], columns: dict[str, str],
               sink: str = "") -> str:
    """A Debezium pipeline keyed by id over ``topics`` (``sink``: more [sink] lines), its
    tables made through the CLI."""
    from tests.helpers import init_cli, toml_config

    config = tmp_path / f"{name}.toml"
    config.write_text(toml_config(name, topics, fmt="raw", extra_sink=(
        'envelope = "debezium"\nmode = "upsert"\nkey = ["id"]\n' + sink)).replace(
        'format = "raw"', 'format = "json"') + "[sink.columns]\n" + "".join(
        f'{k} = "{v}"\n' for k, v in columns.items()))
    init_cli(config)
    return str(config)


def cli_ok(*args: str) -> str:
    r = cli_here(*args)
    assert r.returncode == 0, f"{args}: exit {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-3000:]}"
    return r.stdout


def tx_end(tx: str, **counts: int) -> tuple[bytes, bytes]:
    """Debezium's END event of source transaction ``tx``: its event count per table."""
    return json.dumps({"id": tx}).encode(), json.dumps({
        "status": "END", "id": f"{tx}:0", "event_count": sum(counts.values()),
        "data_collections": [{"data_collection": f"public.{t}", "event_count": n}
                             for t, n in counts.items()]}).encode()


def transactions_config(path, name: str, topics: list[str], metadata: str, columns: str,
                        kafka: str = "", master: str = "local[1]") -> str:
    """A Debezium pipeline keyed by id over ``topics`` into schema ``name`` (a table per
    topic), whole source transactions by the transaction topic ``metadata``; ``columns``:
    the TOML of [sink.columns] (and any per-topic tables), ``kafka``: more [kafka] lines.
    Its tables made through the CLI."""
    from tests.helpers import TEST_DB_URL

    topic_list = ", ".join(f'"{t}"' for t in topics)
    path.write_text(f"""
[pipeline]
name = "{name}"
[kafka]
bootstrap_servers = "{BOOTSTRAP}"
topics = [{topic_list}]
timeout_seconds = 30
{kafka}[database]
url = "{TEST_DB_URL}"
schema = "{name}"
[sink]
format = "json"
envelope = "debezium"
mode = "upsert"
table = "{{table}}"
key = ["id"]
transactions = "{metadata}"
[sink.columns]
{columns}[spark]
master = "{master}"
""")
    cli_ok("init-db", "--config", str(path))
    return str(path)


def change_event(k: int, op: str, after: dict | None = None, before: dict | None = None,
                 schema: dict | None = None) -> tuple[bytes | None, bytes]:
    """A change event as Debezium's JSON converter writes it (``schema``: in Kafka Connect's
    schema envelope); a truncate has no Kafka key."""
    payload = {"before": before, "after": after and {"id": k, **after}, "op": op,
               "source": {"connector": "postgresql", "table": "docs"}, "ts_ms": 0}
    value = payload if schema is None else {"schema": schema, "payload": payload}
    key = None if op == "t" else json.dumps({"id": k}).encode()
    return key, json.dumps(value).encode()


def test_unchanged_toasted_columns_keep_their_stored_values(spark, tmp_path):
    """Under REPLICA IDENTITY DEFAULT an update leaves an unchanged TOASTed column out and
    Debezium sends its placeholder instead (the string, a bytea column's bytes as base64,
    an array's one element). The row keeps the value it had: stored by an earlier run
    (key 1), or written earlier in the same run (keys 2 and 4, across a delete and a
    re-create); a key met first through such an update (key 3) has no value to keep: NULL
    until an update carries one. `verify` recomputes the same. Before: an 8,000-character
    note was replaced by the placeholder."""
    name = unique("dbztoast")
    topic = create_topic(name, 1)
    config = dbz_config(tmp_path, name, [topic], {
        "id": "long not null", "name": "string", "note": "string", "blob": "string",
        "tags": "array<string>"})
    big = {n: f"{n}:" + "x" * 8000 for n in ("one", "two", "three", "four", "five")}
    blob = base64.b64encode(b"\x00\x01 bytes").decode()
    gone = {"note": UNAVAILABLE, "blob": UNAVAILABLE_BYTES, "tags": [UNAVAILABLE]}
    produce(topic, [
        change_event(1, "c", {"name": "a", "note": big["one"], "blob": blob, "tags": ["x"]}),
        change_event(2, "c", {"name": "b", "note": big["two"], "blob": blob, "tags": []}),
        change_event(2, "u", {"name": "b2", **gone, "note": big["three"]}),
        change_event(2, "u", {"name": "b3", **gone}),
        change_event(3, "u", {"name": "c", **gone}),
    ])
    cli_ok("run", "--config", config)
    select = f"SELECT id, name, note, blob, tags FROM {name} ORDER BY id"
    assert query(select) == [(1, "a", big["one"], blob, ["x"]),
                             (2, "b3", big["three"], blob, []),
                             (3, "c", None, None, None)]
    produce(topic, [
        change_event(1, "u", {"name": "a2", **gone}),
        change_event(2, "u", {"name": "b4", "note": UNAVAILABLE, "blob": UNAVAILABLE_BYTES,
                              "tags": ["y"]}),
        change_event(3, "u", {"name": "c2", "note": "small", "blob": UNAVAILABLE_BYTES,
                              "tags": [UNAVAILABLE]}),
        change_event(4, "c", {"name": "d", "note": big["four"], "blob": blob, "tags": []}),
        change_event(4, "u", {"name": "d2", **gone}),
        change_event(4, "d", before={"id": 4}),
        change_event(4, "c", {"name": "d3", "note": big["five"], "blob": None, "tags": ["z"]}),
        change_event(4, "u", {"name": "d4", **gone}),
    ])
    cli_ok("run", "--config", config)
    assert query(select) == [(1, "a2", big["one"], blob, ["x"]),
                             (2, "b4", big["three"], blob, ["y"]),
                             (3, "c2", "small", None, None),
                             (4, "d4", big["five"], None, ["z"])]
    assert "verified:" in cli_ok("verify", "--config", config)


def test_a_primary_key_change_takes_the_old_keys_toasted_value(spark, tmp_path):
    """A primary-key change: delete of the old key, its tombstone, a create of the new key
    (header ``__debezium.oldkey``) whose unchanged TOASTed note is the placeholder. The new
    row has the note the old key had: stored by an earlier run (1 -> 11), then changed
    again in the same run (11 -> 21: a change of a changed key), updated in the run before
    (2 -> 12, past an update that left the note out too), created in the run (3 -> 13).
    `verify` recomputes the same."""
    name = unique("dbzrekey")
    topic = create_topic(name, 1)
    config = dbz_config(tmp_path, name, [topic], {
        "id": "long not null", "name": "string", "note": "string"})
    big = {n: f"{n}:" + "x" * 8000 for n in ("one", "two", "three", "four")}
    produce(topic, [change_event(1, "c", {"name": "a", "note": big["one"]}),
                    change_event(2, "c", {"name": "b", "note": big["two"]})])
    cli_ok("run", "--config", config)

    def rekey(old: int, new: int, name: str) -> None:
        produce(topic, [change_event(old, "d", before={"id": old}),
                        (json.dumps({"id": old}).encode(), None)])
        produce(topic, [change_event(new, "c", {"name": name, "note": UNAVAILABLE})],
                headers=[("__debezium.oldkey", json.dumps({"id": old}).encode())])

    rekey(1, 11, "a")
    rekey(11, 21, "a")
    produce(topic, [change_event(2, "u", {"name": "b", "note": big["three"]}),
                    change_event(2, "u", {"name": "b2", "note": UNAVAILABLE})])
    rekey(2, 12, "b2")
    produce(topic, [change_event(3, "c", {"name": "c", "note": big["four"]})])
    rekey(3, 13, "c")
    cli_ok("run", "--config", config)
    assert query(f"SELECT id, name, note FROM {name} ORDER BY id") == [
        (12, "b2", big["three"]), (13, "c", big["four"]), (21, "a", big["one"])]
    assert "verified:" in cli_ok("verify", "--config", config)


def test_variable_scale_decimals_are_decoded_into_the_declared_decimal(spark, tmp_path):
    """A NUMERIC without precision: Debezium's io.debezium.data.VariableScaleDecimal, a
    struct {scale, value: the unscaled bytes, base64}, in the schema envelope (keys 1-4) or
    bare (key 5). Decoded into the declared decimal(20,4) (a finer scale rounded as Postgres
    rounds); one too large for it (key 4) is a dead letter naming the field. Before: every
    record a dead letter "expected decimal(20,4), got object"."""
    name = unique("dbzvsd")
    topic = create_topic(name, 1)
    config = dbz_config(tmp_path, name, [topic], {"id": "long not null",
                                                  "amount": "decimal(20,4)"})
    vsd = {"field": "amount", "type": "struct", "optional": True,
           "name": "io.debezium.data.VariableScaleDecimal", "version": 1,
           "fields": [{"field": "scale", "type": "int32"}, {"field": "value", "type": "bytes"}]}
    fields = [{"field": "id", "type": "int64"}, vsd]
    schema = {"type": "struct", "fields": [{"field": i, "type": "struct", "optional": True,
                                            "fields": fields} for i in ("before", "after")]
              + [{"field": "op", "type": "string"}]}

    def amount(unscaled: int, scale: int) -> dict:
        n = (unscaled.bit_length() + 8) // 8
        return {"scale": scale,
                "value": base64.b64encode(unscaled.to_bytes(n, "big", signed=True)).decode()}

    produce(topic, [change_event(1, "c", {"amount": amount(12345, 2)}, schema=schema),
                    change_event(2, "c", {"amount": amount(-7, 0)}, schema=schema),
                    change_event(3, "c", {"amount": amount(1234567, 6)}, schema=schema),
                    change_event(4, "c", {"amount": amount(10**17, 0)}, schema=schema),
                    change_event(5, "c", {"amount": amount(5, 1)})])
    cli_ok("run", "--config", config)
    assert query(f"SELECT id, amount FROM {name} ORDER BY id") == [
        (1, Decimal("123.4500")), (2, Decimal("-7.0000")), (3, Decimal("1.2346")),
        (5, Decimal("0.5000"))]
    assert query("SELECT \"offset\", error_type, error_message FROM pipeline_dead_letters "
                 "WHERE pipeline = %s", (name,)) == [
        (3, "wrong_type", "field 'amount': 100000000000000000 is too large for "
                          "decimal(20,4) (at most 16 digits before the point)")]


def test_a_truncate_empties_the_table_in_order_with_the_changes_around_it(spark, tmp_path):
    """`[sink] truncate = "apply"`: a truncate (op `t`) deletes every row whose change is
    older than it by the upsert's ordering rule, in the run's transaction. Partition 0:
    keys 1 and 2 (an earlier run) and 3 (this run) come before the truncate and go, 4 comes
    after it and stays; partition 1: key 5 (an earlier run) and 6 are stamped before the
    truncate and go, 7 after it stays. A replay of every range changes nothing, and
    `verify` agrees. Before: `truncate` was an unknown key (exit 2), and a truncate a dead
    letter while every row stayed."""
    from tests.integration.test_partition_growth import BASE, at, produce_at

    name = unique("dbztrunc")
    topic = create_topic(name, 2)
    config = dbz_config(tmp_path, name, [topic], {"id": "long not null", "name": "string"},
                        sink='truncate = "apply"\n')

    def c(k: int, ts: int):
        return at(change_event(k, "c", {"name": f"n{k}"}), BASE + ts)

    produce_at(topic, 0, [c(1, 0), c(2, 100)])
    produce_at(topic, 1, [c(5, 50)])
    cli_ok("run", "--config", config)
    produce_at(topic, 0, [c(3, 200), at(change_event(0, "t"), BASE + 1000), c(4, 1100)])
    produce_at(topic, 1, [c(6, 900), c(7, 1500)])
    cli_ok("run", "--config", config)
    select = f"SELECT id FROM {name} ORDER BY id"
    assert query(select) == [(4,), (7,)]
    before = query(f"SELECT *, xmin::text FROM {name} ORDER BY id")
    cli_ok("backfill", "--config", config, "--topic", topic, "--partition", "0",
           "--from-offset", "0", "--to-offset", "5")
    assert query(f"SELECT *, xmin::text FROM {name} ORDER BY id") == before
    assert "verified:" in cli_ok("verify", "--config", config)


def test_an_unavailable_not_null_value_with_nothing_stored_is_exit_3_naming_it(spark):
    """Key 1 is first met through an update that left its `not null` note out: no value to
    keep and none to write, so the run stops (exit 3) naming the change, the key and the
    column, nothing committed. Key 2's placeholder follows its create in the same run: fine."""
    name = unique("dbztoastnn")
    topic = create_topic(name, 1)
    settings = init_db(make_settings(name, [topic], sink={
        "envelope": "debezium", "mode": "upsert", "key": ["id"],
        "columns": {"id": "long not null", "note": "string not null", "n": "long"}}))
    produce(topic, [change_event(2, "c", {"note": "kept", "n": 1}),
                    change_event(2, "u", {"note": UNAVAILABLE, "n": 2}),
                    change_event(1, "u", {"note": UNAVAILABLE, "n": 3})])
    with pytest.raises(DataError) as e:
        run_ingest(settings)
    assert f"the change at {topic}[0] offset 2 of key (id=1) leaves the not-null column(s) " \
           "note out" in e.value.message
    assert stored_offsets(name) == {} and query(f"SELECT count(*) FROM {name}") == [(0,)]


def test_changes_kafka_connect_wrote_again_are_never_applied_again_nor_verified(
        spark, tmp_path):
    """[sink] transactions: after a worker's crash Kafka Connect writes transactions 102-104
    (their changes and ENDs) again, after 104. A budget of 6 records per partition ends run
    2 inside the replayed stretch: applied, 102 again would bring back accounts 1 and 2 of
    customer 1 that 104 deleted (the replica at no state the source had), and run 3 would
    delete them again. Each run leaves the replays out (counted, their offsets logged), so
    after every run the replica is the source as of a commit no older than before, and
    verify, which leaves them out by the same rule, says match. Before: run 2 published
    accounts 1 and 2 again."""

    name = unique("dbzreplay")
    accounts, customers, metadata = (create_topic(f"{name}.{t}", 1) for t in (
        "public.accounts", "public.customers", "transaction"))

    def change(table: str, tx: str, order: int, op: str, k: int, row: dict | None):
        payload = {"before": {"id": k} if op == "d" else None,
                   "after": row and {"id": k, **row}, "op": op,
                   "source": {"connector": "postgresql", "table": table, "txId": int(tx)},
                   "ts_ms": 0, "transaction": {"id": f"{tx}:{1000 + order}", "total_order":
                                               order, "data_collection_order": order}}
        return json.dumps({"id": k}).encode(), json.dumps(payload).encode()

    def deleted(table: str, tx: str, order: int, k: int) -> list:
        return [change(table, tx, order, "d", k, None), (json.dumps({"id": k}).encode(), None)]

    # The source's transactions: their account events, customer events and END; and the
    # replica's state after each (customers, accounts).
    a = {"101": [change("accounts", "101", 1, "c", 1, {"customer_id": 1, "balance": 0}),
                 change("accounts", "101", 2, "c", 2, {"customer_id": 1, "balance": 0})],
         "102": [change("accounts", "102", 1, "u", 1, {"customer_id": 1, "balance": -10}),
                 change("accounts", "102", 2, "u", 2, {"customer_id": 1, "balance": 10})],
         "103": [change("accounts", "103", 1, "u", 2, {"customer_id": 1, "balance": 5}),
                 change("accounts", "103", 2, "u", 1, {"customer_id": 1, "balance": -5})],
         "104": deleted("accounts", "104", 1, 1) + deleted("accounts", "104", 2, 2),
         "105": [change("accounts", "105", 1, "c", 3, {"customer_id": 2, "balance": 0})]}
    c = {"101": [change("customers", "101", 1, "c", 1, {"name": "ada"})],
         "104": deleted("customers", "104", 1, 1),
         "105": [change("customers", "105", 1, "c", 2, {"name": "bo"})]}
    ends = {"101": tx_end("101", accounts=2, customers=1), "102": tx_end("102", accounts=2),
            "103": tx_end("103", accounts=2), "104": tx_end("104", accounts=2, customers=1),
            "105": tx_end("105", accounts=1, customers=1)}
    states = [([], []), ([(1, "ada")], [(1, 1, 0), (2, 1, 0)]),
              ([(1, "ada")], [(1, 1, -10), (2, 1, 10)]),
              ([(1, "ada")], [(1, 1, -5), (2, 1, 5)]), ([], []),
              ([(2, "bo")], [(3, 2, 0)])]
    order = ["101", "102", "103", "104", "102", "103", "104", "105"]  # 102-104 written again
    produce(accounts, [e for tx in order for e in a.get(tx, [])])
    produce(customers, [e for tx in order for e in c.get(tx, [])])
    produce(metadata, [ends[tx] for tx in order])

    config = transactions_config(
        tmp_path / "replays.toml", name, [accounts, customers], metadata,
        'id = "long not null"\ncustomer_id = "long"\nbalance = "long"\n'
        f'[sink.topics."{customers}".columns]\nid = "long not null"\nname = "string"\n',
        kafka="max_records_per_partition = 6\n")

    def replica() -> tuple[list, list]:
        return (query(f'SELECT id, name FROM "{name}".customers ORDER BY id'),
                query(f'SELECT id, customer_id, balance FROM "{name}".accounts ORDER BY id'))

    # Run 1: 101-103 (104 waits for its accounts); run 2: 104, and the replays of 102 and of
    # 104's customer (10-11, 3-4) left out; run 3: those of 103 and 104's accounts; run 4: 105.
    was, replayed = 0, []
    for run in range(4):
        r = cli_here("run", "--config", str(config), "--json")
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
        replayed.append(json.loads(r.stdout)["transactions"].get("replayed"))
        assert replica() in states[was:], \
            f"run {run + 1}: {replica()} is no state of the source since {states[was]}"
        if run == 1:
            assert f"left out: {accounts}[0] 10-11, {customers}[0] 3-4" in r.stdout + r.stderr
        was = states.index(replica(), was)
        r = cli_here("verify", "--config", str(config), "--json")
        assert r.returncode == 0, f"run {run + 1}: " + r.stdout[-3000:] + r.stderr[-2000:]
        assert json.loads(r.stdout)["verdict"] == "match"
    assert was == len(states) - 1 and replayed == [0, 4, 6, 0]
    assert sorted(t["replayed"] for t in json.loads(r.stdout)["tables"].values()) == [2, 8]


def test_a_source_transaction_recorded_again_keeps_the_run_that_published_it_first(
        stack, tmp_path):
    """pipeline_source_transactions (store/source_transactions.py): a transaction recorded
    again (its END read again after Kafka Connect's restart) keeps its first run, and only
    the new ones count."""
    from pipeline.settings.load import load_settings
    from pipeline.store import Store

    name = unique("dbzrec")
    config = transactions_config(tmp_path / "rec.toml", name, [f"{name}.public.rows"],
                                 f"{name}.transaction", 'id = "long not null"\n')
    with Store(load_settings(config)) as store:
        first, second = store.runs.start("ingest"), store.runs.start("ingest")
        assert store.source_transactions.record(first, ["741", "742"]) == 2
        assert store.source_transactions.record(second, ["742", "743", "743"]) == 1
    assert query(f'SELECT tx, run_id FROM "{name}".pipeline_source_transactions ORDER BY 1'
                 ) == [("741", first.id), ("742", first.id), ("743", second.id)]


def test_a_run_of_more_source_transactions_than_a_statement_binds_publishes_them_whole(
        spark, tmp_path):
    """[sink] transactions: a run's backlog of 70,000 source transactions (a first run after
    a snapshot, a catch-up) is looked up and recorded as published in statements of a fixed
    size: before, the lookup bound one parameter per transaction (Postgres takes at most
    65,535) and every run failed as 'Postgres unreachable' (exit 75) and was retried
    forever. A transaction written again afterwards is still left out."""

    name = unique("dbzmany")
    rows, metadata = create_topic(f"{name}.public.rows", 1), create_topic(f"{name}.transaction", 1)
    n = 70_000

    def change(tx: int) -> tuple[bytes, bytes]:
        return json.dumps({"id": tx}).encode(), json.dumps({
            "before": None, "after": {"id": tx, "v": tx % 7}, "op": "c",
            "source": {"connector": "postgresql", "table": "rows", "txId": tx},
            "transaction": {"id": f"{tx}:1", "total_order": 1, "data_collection_order": 1},
        }).encode()

    produce(rows, [change(tx) for tx in range(1, n + 1)])
    produce(metadata, [tx_end(str(tx), rows=1) for tx in range(1, n + 1)])
    config = transactions_config(tmp_path / "many.toml", name, [rows], metadata,
                                 'id = "long not null"\nv = "long"\n', master="local[2]")

    r = cli_here("run", "--config", str(config), "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert query(f'SELECT topic, next_offset FROM "{name}".pipeline_offsets ORDER BY 1'
                 ) == sorted([(rows, n), (metadata, n)])
    assert query(f'SELECT count(*), sum(v) FROM "{name}".rows') == [
        (n, sum(tx % 7 for tx in range(1, n + 1)))]
    assert query(f'SELECT count(*) FROM "{name}".pipeline_source_transactions') == [(n,)]

    # Kafka Connect writes the last 66,000 again after a restart, changed as a bug would:
    # each is a replay of a published transaction, left out.
    produce(rows, [(k, v.replace(b'"v": ', b'"v": 100')) for k, v in
                   (change(tx) for tx in range(n - 66_000 + 1, n + 1))])
    produce(metadata, [tx_end(str(tx), rows=1) for tx in range(n - 66_000 + 1, n + 1)])
    r = cli_here("run", "--config", str(config), "--json")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    assert json.loads(r.stdout)["transactions"]["replayed"] == 66_000
    assert query(f'SELECT count(*), sum(v) FROM "{name}".rows') == [
        (n, sum(tx % 7 for tx in range(1, n + 1)))]


def row_change(tx: int) -> tuple[bytes, bytes]:
    """Source transaction ``tx``'s one change: a create of row ``tx`` in table rows."""
    return json.dumps({"id": tx}).encode(), json.dumps({
        "before": None, "after": {"id": tx, "v": tx}, "op": "c",
        "source": {"connector": "postgresql", "table": "rows", "txId": tx},
        "transaction": {"id": f"{tx}:1", "total_order": 1, "data_collection_order": 1},
    }).encode()


def test_ends_written_after_the_transaction_topic_was_read_ahead_are_read_by_the_cut(
        spark, tmp_path):
    """[sink] transactions: the transaction topic is read during the data's read
    (driver/transaction_prefetch.py), here held at its end until the END of transaction 2
    is written: the cut keeps the END of 1 read ahead and reads the one of 2 after it, so
    the run publishes both, whole (either one not read would leave its transaction out),
    and not 3, whose END is not written."""
    from tests.integration._reliability import finish, start_waiting

    name = unique("dbzahead")
    rows, metadata = create_topic(f"{name}.public.rows", 1), create_topic(f"{name}.transaction", 1)
    produce(rows, [row_change(tx) for tx in (1, 2, 3)])
    produce(metadata, [tx_end("1", rows=1)])
    config = transactions_config(tmp_path / "ahead.toml", name, [rows], metadata,
                                 'id = "long not null"\nv = "long"\n')
    go = tmp_path / "go"
    run = start_waiting("run", "--config", config, "--json", point="transactions_read_ahead",
                        go=go)
    produce(metadata, [tx_end("2", rows=1)])
    go.touch()
    code, out, err = finish(run)
    assert code == 0, err[-3000:]
    assert "([0, 1) read during the data's read)" in err
    assert json.loads(out)["transactions"]["included"] == 2
    assert query(f'SELECT id FROM "{name}".rows ORDER BY id') == [(1,), (2,)]
    assert query(f'SELECT topic, next_offset FROM "{name}".pipeline_offsets ORDER BY 1'
                 ) == sorted([(rows, 2), (metadata, 2)])


def test_a_failed_read_ahead_of_the_transaction_topic_is_read_again_by_the_cut(
        spark, tmp_path):
    """[sink] transactions: the thread that reads the transaction topic during the data's
    read fails; the cut reads the topic itself, as if nothing had been read ahead: the run
    publishes the whole transactions (1 and 2) and leaves out the one whose END is not
    written yet (3)."""
    name = unique("dbzaheadfail")
    rows, metadata = create_topic(f"{name}.public.rows", 1), create_topic(f"{name}.transaction", 1)
    produce(rows, [row_change(tx) for tx in (1, 2, 3)])
    produce(metadata, [tx_end("1", rows=1), tx_end("2", rows=1)])
    config = transactions_config(tmp_path / "fails.toml", name, [rows], metadata,
                                 'id = "long not null"\nv = "long"\n')
    r = run_cli("run", "--config", config, "--json",
                env={"PIPELINE_FAULT": "transactions_read_ahead:raise"})
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"the read ahead of {metadata}[0] [0, 2) failed (InjectedFault" in r.stderr
    assert json.loads(r.stdout)["transactions"]["included"] == 2
    assert query(f'SELECT id FROM "{name}".rows ORDER BY id') == [(1,), (2,)]
    assert query(f'SELECT topic, next_offset FROM "{name}".pipeline_offsets ORDER BY 1'
                 ) == sorted([(rows, 2), (metadata, 2)])
