"""[sink] mode = append | upsert | aggregate, without Kafka, Spark or Postgres: the config
rules, the tables each mode gets, the tombstone lines the encoder makes, the merge SQL, and
what each mode's strategy (pipeline/sinks/) allows."""

import pytest
from sqlalchemy.dialects import postgresql
from sqlalchemy.schema import CreateTable

from pipeline import sinks
from pipeline.config import Aggregate, parse_settings
from pipeline.errors import ConfigError
from pipeline.formats.encode import Encoder
from pipeline.plan.offsets import PartitionOffsets
from pipeline.sinks import upsert as upsert_sink
from pipeline.store import tables
from pipeline.store.run import Kind, Run
from tests.unit.test_encode import Record

COLS = {"region": "string", "order_id": "long", "amount": "decimal(12,2)",
        "placed_at": "timestamp", "paid": "boolean", "qty": "long", "note": "string",
        "score": "double", "units": "int"}


def settings(columns=None, **sink):
    return parse_settings({
        "pipeline": {"name": "p1"},
        "kafka": {"bootstrap_servers": "h:9092", "topics": ["t"]},
        "database": {"url": "postgresql://u:pw@h/db", "schema": "sch"},
        "sink": {"format": "json", "table": "orders",
                 "columns": COLS if columns is None else columns, **sink},
    }, environ={})


def refused(columns=None, **sink) -> str:
    with pytest.raises(ConfigError) as e:
        settings(columns, **sink)
    assert "\n" not in e.value.message
    return e.value.message


def ddl(table) -> str:
    return str(CreateTable(table).compile(dialect=postgresql.dialect()))


def agg(**aggregates):
    return settings(mode="aggregate", group_by=["region"], aggregates=aggregates).sink


def sink_of(**sink) -> sinks.Sink:
    return sinks.for_settings(settings(**sink))


# ---- config ------------------------------------------------------------------------------
def test_default_mode_is_append_with_no_key_and_nothing_deletes():
    sink = settings().sink
    assert (sink.mode, sink.key, sink.aggregates, sink.deletes) == ("append", (), (), False)


def test_upsert_keeps_the_declared_key_order_and_makes_key_columns_required():
    sink = settings(mode="upsert", key=["region", "order_id"]).sink
    assert sink.key == ("region", "order_id") and sink.deletes
    assert {c.name for c in sink.columns if c.required} == {"region", "order_id"}
    sink = settings(mode="upsert", key=["order_id"], tombstones="dead_letter").sink
    assert sink.tombstones == "dead_letter" and not sink.deletes


@pytest.mark.parametrize("sink, names", [
    ({"mode": "merge"}, ["'sink.mode'", "append, upsert, aggregate"]),
    ({"mode": "upsert"}, ["'sink.key'"]),
    ({"mode": "upsert", "key": []}, ["'sink.key'", "non-empty"]),
    ({"mode": "upsert", "key": ["order_id", "order_id"]}, ["'sink.key'", "distinct"]),
    ({"mode": "upsert", "key": ["nope"]}, ["'sink.key'", "'nope'", "[sink.columns]"]),
    ({"mode": "upsert", "key": ["score"]}, ["'sink.key'", "'score'", "double"]),
    ({"key": ["order_id"]}, ["'sink.key'", "'upsert'", "'append'"]),
    ({"tombstones": "delete"}, ["'sink.tombstones'", "'upsert'"]),
    ({"mode": "upsert", "key": ["order_id"], "tombstones": "ignore"},
     ["'sink.tombstones'", "delete, dead_letter"]),
    ({"group_by": ["region"]}, ["'sink.group_by'", "'aggregate'"]),
    ({"mode": "upsert", "key": ["order_id"], "aggregates": {"n": "count"}},
     ["'sink.aggregates'", "'aggregate'", "'upsert'"]),
    ({"mode": "aggregate", "group_by": ["region"], "aggregates": {"n": "count"},
      "key": ["region"]}, ["'sink.key'", "'aggregate'"]),
    # A tombstone cannot delete under a transform yet: the default is refused, and named.
    ({"mode": "upsert", "key": ["order_id"], "transform": "m:f"},
     ["'sink.transform'", "'m:f'", "'upsert'", 'tombstones = "dead_letter"']),
    ({"mode": "upsert", "key": ["order_id"], "transform": "m:f", "tombstones": "delete"},
     ["'sink.transform'", "'upsert'", 'tombstones = "dead_letter"']),
    ({"mode": "aggregate", "group_by": ["nope"], "aggregates": {"n": "count"}},
     ["'sink.group_by'", "'nope'"]),
    ({"mode": "aggregate", "group_by": ["region"], "aggregates": {}}, ["[sink.aggregates]"]),
])
def test_bad_mode_settings_are_one_line_errors_naming_the_key(sink, names):
    message = refused(**sink)
    for name in names:
        assert name in message, (name, message)


def test_a_transform_is_accepted_for_upsert_and_aggregate():
    up = settings(mode="upsert", key=["order_id"], transform="m:f",
                  tombstones="dead_letter").sink
    assert (up.mode, up.key, up.transform, up.deletes) == ("upsert", ("order_id",), "m:f",
                                                           False)
    ag = settings(mode="aggregate", group_by=["region"], aggregates={"n": "count(*)"},
                  transform="m:f").sink
    assert (ag.mode, ag.key, ag.transform) == ("aggregate", ("region",), "m:f")


def test_upsert_and_aggregate_need_the_json_format():
    message = refused({}, format="raw", mode="upsert", key=["k"])
    assert "sink.format = 'json'" in message and "'upsert'" in message


@pytest.mark.parametrize("name, spec, says", [
    ("a", "avg(amount)", "sum(column)"),
    ("a", "sum(*)", "sum(*) is not defined"),
    ("a", "sum(note)", "'note' is string"),
    ("a", "min(paid)", "min() of a boolean"),
    ("a", "max(paid)", "max() of a boolean"),
    ("a", "count(ghost)", "'ghost', which is not in [sink.columns]"),
    ("a", 5, "sum(column)"),
    ("region", "count", "clashes with a group_by"),
    ("run_id", "count", "clashes with a group_by or reserved"),
    ("updated_at", "count", "clashes with a group_by or reserved"),
])
def test_a_bad_aggregate_is_refused_naming_its_key(name, spec, says):
    message = refused(mode="aggregate", group_by=["region"], aggregates={name: spec})
    assert f"'sink.aggregates.{name}'" in message and says in message, message


def test_count_forms_and_sums_of_numbers_are_accepted_in_declared_order():
    sink = agg(n="count", star="COUNT( * )", paid_n="count(paid)", total="sum(amount)",
               items="sum(qty)", points="sum(score)", first="min(placed_at)", top="max(note)")
    assert sink.key == ("region",) and [c.name for c in sink.columns if c.required] == [
        "region"]
    assert sink.aggregates == (
        Aggregate("n", "count", None), Aggregate("star", "count", None),
        Aggregate("paid_n", "count", "paid"), Aggregate("total", "sum", "amount"),
        Aggregate("items", "sum", "qty"), Aggregate("points", "sum", "score"),
        Aggregate("first", "min", "placed_at"), Aggregate("top", "max", "note"))


# Columns a mode adds to its own tables: a declared column of that name is refused.
@pytest.mark.parametrize("columns, sink", [
    ({"updated_at": "timestamp", "qty": "long"},
     {"mode": "aggregate", "group_by": ["updated_at"], "aggregates": {"n": "count"}}),
    ({"deleted_at": "timestamp"}, {"mode": "upsert", "key": ["deleted_at"]}),
    ({"_tombstone": "boolean", "order_id": "long"}, {"mode": "upsert", "key": ["order_id"]}),
    ({"_order_time": "timestamp", "order_id": "long"}, {"mode": "upsert", "key": ["order_id"]}),
    ({"_unavailable": "string", "order_id": "long"}, {"mode": "upsert", "key": ["order_id"]}),
], ids=["group_by-updated_at", "upsert-key-deleted_at", "upsert-column-_tombstone",
        "upsert-column-_order_time", "upsert-column-_unavailable"])
def test_a_column_named_like_a_mode_column_is_a_config_error(columns, sink):
    clash = next(iter(columns))
    with pytest.raises(ConfigError, match=f"{clash}.*(clashes|reserved)"):
        settings(columns, **sink)


# ---- tables ------------------------------------------------------------------------------
def test_upsert_results_are_keyed_by_the_business_key_with_no_serial():
    table = sink_of(mode="upsert", key=["order_id", "region"]).results
    assert [c.name for c in table.primary_key] == ["order_id", "region"]
    for name in ("topic", "partition", "offset", "order_id", "region", "run_id"):
        assert not table.c[name].nullable, name
    text = ddl(table)
    assert "SERIAL" not in text.upper() and "IDENTITY" not in text.upper()
    assert "PRIMARY KEY (order_id, region)" in text


def test_a_lone_integer_upsert_key_is_not_made_a_serial():
    for table in sink_of(mode="upsert", key=["order_id"]).tables:
        assert "SERIAL" not in ddl(table).upper(), table.name
        assert [c.name for c in table.primary_key] == ["order_id"]


def test_aggregate_results_are_keyed_by_group_by_with_aggregate_types():
    table = sink_of(mode="aggregate", group_by=["region", "order_id"], aggregates={
        "n": "count", "total": "sum(amount)", "items": "sum(qty)", "top": "max(amount)",
        "first": "min(placed_at)", "points": "sum(score)", "low": "min(note)",
        "many": "sum(units)", "few": "min(units)"}).results
    assert [c.name for c in table.primary_key] == ["region", "order_id"]
    assert [c.name for c in table.columns] == ["region", "order_id", "n", "total", "items",
                                               "top", "first", "points", "low", "many", "few",
                                               "run_id", "updated_at"]
    assert dict(tables.typed(table.columns)) == {
        "region": "text", "order_id": "bigint", "n": "bigint", "total": "numeric(38,2)",
        "items": "bigint", "top": "numeric(12,2)", "first": "timestamp with time zone",
        "points": "double precision", "low": "text", "many": "bigint", "few": "integer",
        "run_id": "bigint",
        "updated_at": "timestamp with time zone"}
    assert "SERIAL" not in ddl(table).upper()


def test_only_an_upsert_sink_gets_a_deleted_table():
    assert [t.name for t in sink_of().tables] == ["orders"]
    assert [t.name for t in sink_of(mode="aggregate", group_by=["region"],
                                    aggregates={"n": "count"}).tables] == ["orders"]
    for tombstones in ("delete", "dead_letter"):
        sink = sink_of(mode="upsert", key=["region"], tombstones=tombstones)
        assert [t.name for t in sink.tables] == ["orders", "orders_deleted"]


def test_the_deleted_table_holds_the_key_and_the_deleting_record():
    deleted = sink_of(mode="upsert", key=["region", "order_id"]).deleted
    assert [c.name for c in deleted.primary_key] == ["region", "order_id"]
    assert [c.name for c in tables.written(deleted)] == [
        "region", "order_id", "topic", "partition", "offset", "kafka_timestamp", "run_id",
        "_order_time"]


def test_tombstone_columns_and_the_batch_flag_follow_the_key():
    sink = settings(mode="upsert", key=["region", "order_id"]).sink
    assert tables.tombstone_columns(sink) == ["topic", "partition", "offset",
                                              "kafka_timestamp", "region", "order_id",
                                              "run_id", "_tombstone"]
    batch = tables.record_batch(sink, "b")
    assert set(tables.tombstone_columns(sink)) <= set(batch.c.keys())
    assert batch.c._tombstone.server_default is not None
    quiet = settings(mode="upsert", key=["order_id"], tombstones="dead_letter").sink
    assert "_tombstone" not in tables.record_batch(quiet, "b").c


# ---- the encoder's tombstones ------------------------------------------------------------
TS = "2023-11-14 22:13:20.123000+00"  # Record's default timestamp


def encoded(sink, *records, run_id=7):
    columns = tuple((c.name, c.type, c.required) for c in sink.columns)
    return Encoder("json", columns, run_id, sink.key if sink.deletes else ()).encode(
        "orders", 2, list(records))


def upsert(*key):
    return settings(mode="upsert", key=list(key)).sink


@pytest.mark.parametrize("key_columns, kafka_key, fields", [
    (["order_id"], b'{"order_id": 42, "other": "x"}', ["42"]),
    (["order_id"], b"42", ["42"]),
    (["note"], b"A-17", ["A-17"]),
    (["note"], b'"A-17"', ["A-17"]),
    (["note"], b"123", ["123"]),
    (["note"], b"a\tb", ["a\\tb"]),
    (["region", "order_id"], b'{"order_id": 7, "region": "eu"}', ["eu", "7"]),
])
def test_a_null_value_with_a_usable_key_is_one_tombstone_line(key_columns, kafka_key, fields):
    sink = upsert(*key_columns)
    rows, dead, tombstones = encoded(sink, Record(5, None, kafka_key))
    assert rows == [] and dead == []
    assert tombstones == ["\t".join(["orders", "2", "5", TS, *fields, "7", "t"]) + "\n"]
    assert len(tombstones[0].rstrip("\n").split("\t")) == len(tables.tombstone_columns(sink))


def test_tombstones_and_rows_of_one_batch_are_kept_apart():
    rows, dead, tombstones = encoded(upsert("order_id"),
                                     Record(0, b'{"order_id": 1, "region": "eu"}'),
                                     Record(1, None, b"1"), Record(2, None, b"2"))
    assert [r.split("\t")[2] for r in rows] == ["0"] and dead == []
    assert [t.split("\t")[2] for t in tombstones] == ["1", "2"]
    assert all(t.endswith("\t7\tt\n") for t in tombstones)


@pytest.mark.parametrize("key_columns, kafka_key, why", [
    (["order_id"], None, "has no Kafka key"),
    (["note"], b"\xff\xfe", "not UTF-8"),
    (["order_id"], b"abc", "not a JSON object with order_id"),
    (["order_id"], b'"42"', "'order_id' is not a long"),
    (["order_id"], b"1.5", "'order_id' is not a long"),
    (["order_id"], b'{"order_id": null}', "without 'order_id'"),
    (["region", "order_id"], b'{"order_id": 7}', "without 'region'"),
    (["region", "order_id"], b"7", "not a JSON object with region, order_id"),
    (["note"], b'"a\\u0000b"', "NUL"),
])
def test_a_null_value_whose_key_names_no_row_is_a_bad_tombstone(key_columns, kafka_key, why):
    rows, dead, tombstones = encoded(upsert(*key_columns), Record(3, None, kafka_key))
    assert rows == [] and tombstones == [] and len(dead) == 1
    fields = dead[0].rstrip("\n").split("\t")
    assert fields[2] == "3" and fields[7] == "bad_tombstone"
    assert why in fields[8] and "cannot name the row to delete" in fields[8], fields[8]


def test_any_text_names_a_string_key_even_null():
    _, dead, tombstones = encoded(upsert("note"), Record(0, None, b"null"))
    assert dead == [] and tombstones[0].split("\t")[4] == "null"


@pytest.mark.parametrize("sink", [
    settings().sink,
    settings(mode="upsert", key=["order_id"], tombstones="dead_letter").sink,
    settings(mode="aggregate", group_by=["order_id"], aggregates={"n": "count"}).sink,
], ids=["append", "upsert-dead_letter", "aggregate"])
def test_without_deleting_tombstones_a_null_value_is_a_null_value_dead_letter(sink):
    rows, dead, tombstones = encoded(sink, Record(4, None, b'{"order_id": 1}'))
    assert rows == [] and tombstones == []
    assert [line.split("\t")[7] for line in dead] == ["null_value"]


# ---- merge SQL ---------------------------------------------------------------------------
def test_newer_is_the_offset_within_a_partition_and_the_order_time_across():
    """One rule for every kind of run (before: an ingest took any record of another
    partition, a backfill none): within a partition the offsets; across partitions the
    order_key, a row value (the order time, NULL oldest, then the partition, the topic),
    so two partitions never tie. The order time is the stored one (NULL: an older table's
    row, its own timestamp), a timestamp from year 10000 on none."""
    time = ('coalesce(coalesce("{t}"."_order_time", (CASE WHEN "{t}".kafka_timestamp < '
            "'10000-01-01 00:00:00+00'::timestamptz THEN \"{t}\".kafka_timestamp END)), "
            "'-infinity')")
    key = f'({time}, "{{t}}"."partition", "{{t}}".topic, "{{t}}"."offset")'
    assert upsert_sink.order_key("r").as_string(None) == key.format(t="r")
    assert upsert_sink.newer("l", "r").as_string(None) == (
        '(CASE WHEN "l".topic = "r".topic AND "l".partition = "r".partition '
        'THEN "l"."offset" > "r"."offset" '
        f'ELSE {key.format(t="l")} > {key.format(t="r")} END)')


def test_partitions_added_names_the_topics_that_grew():
    def kafka(topic, n):
        return [PartitionOffsets(topic, p, 0, 0) for p in range(n)]

    stored = {("a", 0): 5, ("a", 1): 3, ("b", 0): 1}
    added = upsert_sink.partitions_added
    assert added(stored, kafka("a", 4) + kafka("b", 1) + kafka("c", 2)) == {
        "a": ([0, 1], [2, 3])}  # c: never read yet, so not grown
    assert added({}, kafka("a", 2)) == {}


def test_aggregates_add_sums_and_counts_and_keep_the_extremes():
    s = settings(mode="aggregate", group_by=["region"], aggregates={
        "n": "count", "paid_n": "count(paid)", "total": "sum(amount)",
        "lo": "min(amount)", "hi": "max(placed_at)"})
    text = sinks.for_settings(s).merge_sql("src").as_string(None)
    assert text.startswith('INSERT INTO "sch"."orders" AS g ("region", "n", "paid_n", '
                           '"total", "lo", "hi", run_id) SELECT "region", count(*), '
                           'count("paid"), sum("amount"), min("amount"), max("placed_at"), '
                           '%s FROM "src" GROUP BY "region" ON CONFLICT ("region") DO UPDATE')
    for name in ("n", "paid_n", "total"):
        assert (f'"{name}" = coalesce(g."{name}" + EXCLUDED."{name}", g."{name}", '
                f'EXCLUDED."{name}")') in text
    assert '"lo" = least(g."lo", EXCLUDED."lo")' in text
    assert '"hi" = greatest(g."hi", EXCLUDED."hi")' in text
    assert text.endswith("run_id = EXCLUDED.run_id, updated_at = now()")


def test_append_keeps_rows_or_replaces_them_on_reprocess_by_coordinates():
    sink = sink_of()
    keep = sink.merge_sql("src", overwrite=False).as_string(None)
    assert keep.endswith('ON CONFLICT ("topic", "partition", "offset") DO NOTHING')
    redo = sink.merge_sql("src", overwrite=True).as_string(None)
    assert 'DISTINCT ON ("topic", "partition", "offset")' in redo
    assert '"amount" = EXCLUDED."amount"' in redo and '"offset" = EXCLUDED' not in redo


# ---- the strategies ----------------------------------------------------------------------
UPSERT = {"mode": "upsert", "key": ["order_id"]}
AGGREGATE = {"mode": "aggregate", "group_by": ["region"], "aggregates": {"n": "count"}}


def a_run(kind):
    return Run(7, Kind(kind), "p1", "sch")


def test_each_mode_is_its_own_strategy_chosen_once_from_the_settings():
    assert type(sink_of()) is sinks.Append
    assert type(sink_of(**UPSERT)) is sinks.Upsert
    assert type(sink_of(**AGGREGATE)) is sinks.Aggregate
    assert set(sinks.MODES) == {"append", "upsert", "aggregate"}
    assert sink_of().t("orders").as_string(None) == '"sch"."orders"'


def test_only_an_append_sink_copies_straight_into_its_table_and_never_on_reprocess():
    assert sink_of().copies_directly(a_run("ingest"))
    assert sink_of().copies_directly(a_run("backfill"))
    assert not sink_of().copies_directly(a_run("reprocess"))
    for sink in (sink_of(**UPSERT), sink_of(**AGGREGATE)):
        assert not sink.copies_directly(a_run("ingest"))


def test_only_an_aggregate_refuses_to_read_committed_records_again():
    assert sink_of().refuses_reread("a backfill") is None
    assert sink_of(**UPSERT).refuses_reread("a backfill") is None
    why = sink_of(**AGGREGATE).refuses_reread("a backfill")
    assert "pipeline 'p1' aggregates" in why and "a backfill would count them again" in why
    assert "TRUNCATE" in why and "orders" in why and "\n" not in why


class Recorder:
    """A psycopg connection that records what it is asked to run."""

    def __init__(self):
        self.statements = []

    def execute(self, query, params=None):
        self.statements.append((query.as_string(None), params))


@pytest.mark.parametrize("sink, archived, drops", [
    ({}, 5, []),
    (UPSERT, 5, ['DELETE FROM "sch"."orders_deleted" WHERE topic = %s']),
    (AGGREGATE, 0, []),
], ids=["append", "upsert", "aggregate"])
def test_a_recreated_topic_archives_rows_but_an_aggregates_totals_stay(sink, archived, drops):
    conn, called = Recorder(), []
    moved = sink_of(**sink).archive_recreated(conn, "t", lambda: called.append(1) or 5)
    assert moved == archived and called == ([1] if archived else [])
    assert conn.statements == [(d, ("t",)) for d in drops]


def test_only_an_upsert_sink_has_a_note_on_partitions_that_moved_keys():
    assert sink_of().growth_note() == "" and sink_of(**AGGREGATE).growth_note() == ""
    assert "latest Kafka timestamp" in sink_of(**UPSERT).growth_note()
