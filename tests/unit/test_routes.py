"""Routes: each topic's table from [sink] table (a template of the topic's name) and its
[sink.topics."<topic>"] keys (settings/routes.py, settings/table_template.py). Pure."""

import pytest

from pipeline.config import parse_settings
from pipeline.errors import EXIT_CONFIG, ConfigError
from pipeline.settings.kafka import KafkaSettings
from pipeline.settings.table_template import check_template, name_parts, resolve_table

ORDERS, LINES = "shop.public.orders", "shop.public.order_lines"


def settings(topics=(ORDERS, LINES), pattern=None, sink_topics=None, **sink):
    """``sink_topics``: the [sink.topics."<topic>"] tables; ``sink``: other [sink] keys."""
    kafka = {"topic_pattern": pattern} if pattern else {"topics": list(topics)}
    if sink_topics is not None:
        sink["topics"] = sink_topics
    return parse_settings({
        "pipeline": {"name": "p1"},
        "kafka": {"bootstrap_servers": "h:9092", **kafka},
        "database": {"url": "postgresql://u:pw@h/db"},
        "sink": {"format": "json", "table": "{table}",
                 "columns": {"id": "long not null", "note": "string"}, **sink},
    }, environ={})


def config_error(**kwargs) -> str:
    with pytest.raises(ConfigError) as e:
        s = settings(**kwargs)
        s.routes.tables(s.kafka.topics)
    assert e.value.exit_code == EXIT_CONFIG and "\n" not in e.value.message
    return e.value.message


def test_debezium_topic_names_split_into_prefix_schema_and_table():
    assert name_parts("shop.public.orders") == {"prefix": "shop", "schema": "public",
                                                 "table": "orders"}
    # A prefix may hold dots itself: the schema and table are the last two parts.
    assert name_parts("eu.shop.public.orders") == {"prefix": "eu.shop", "schema": "public",
                                                    "table": "orders"}
    assert name_parts("orders") == {}
    assert resolve_table("{schema}_{table}", "shop.inventory.items") == "inventory_items"
    assert resolve_table("replica_{table}", ORDERS) == "replica_orders"
    assert resolve_table("orders", "anything") == "orders"  # no placeholder: one table


def test_each_topic_goes_to_the_table_its_template_names():
    s = settings()
    assert [(t.table, t.topics) for t in s.routes.tables(s.kafka.topics)] == [
        ("order_lines", (LINES,)), ("orders", (ORDERS,))]
    assert s.routes.for_topic(ORDERS).table == "orders"
    assert s.routes.one_table is None


def test_a_table_without_placeholder_takes_every_topic_as_before():
    s = settings(table="events")
    (only,) = s.routes.tables(s.kafka.topics)
    assert (only.table, only.topics) == ("events", (LINES, ORDERS))
    assert s.routes.one_table == "events" and s.routes.for_topic(ORDERS) is s.sink


def test_a_topics_own_keys_override_sink_and_a_new_mode_drops_the_old_modes_keys():
    s = settings(mode="upsert", key=["id"], sink_topics={
        LINES: {"table": "lines", "mode": "append"},
        ORDERS: {"columns": {"id": "long not null", "total": "decimal(12,2)"}}})
    lines, orders = s.routes.tables(s.kafka.topics)
    assert (lines.table, lines.sink.mode, lines.sink.key) == ("lines", "append", ())
    assert (orders.table, orders.sink.mode, orders.sink.key) == ("orders", "upsert", ("id",))
    assert [c.name for c in orders.sink.columns] == ["id", "total"]
    assert [c.name for c in lines.sink.columns] == ["id", "note"]  # [sink]'s


@pytest.mark.parametrize("kwargs, named", [
    ({"table": "{tbl}"}, ["'sink.table'", "{tbl} is no placeholder", "use {topic}"]),
    ({"table": "Shop_{table}"}, ["'sink.table'", "lowercase letters, digits and _"]),
    ({"topics": ("orders",)}, ["topic 'orders' is not named <prefix>.<schema>.<table>",
                               '[sink.topics."orders"] table = "..."']),
    ({"table": "{topic}"}, [f"topic '{ORDERS}'", "not a safe SQL identifier",
                            f'[sink.topics."{ORDERS}"]']),
    ({"sink_topics": {"nope": {"table": "x"}}}, ['[sink.topics."nope"]', "not a topic of this "
                                              "pipeline", "fix the topic's name"]),
    ({"sink_topics": {ORDERS: {"tabel": "x"}}}, [f"unknown key 'sink.topics.\"{ORDERS}\".tabel'",
                                              "allowed: aggregates, columns"]),
    ({"sink_topics": {ORDERS: {"format": "avro"}}}, [f"'sink.topics.\"{ORDERS}\".format'"]),
    ({"sink_topics": {ORDERS: {"mode": "upsert"}}}, [f'[sink.topics."{ORDERS}"]', "sink.key"]),
    ({"sink_topics": {LINES: {"table": "orders", "mode": "upsert", "key": ["id"]}}},
     [f"topics '{LINES}' and '{ORDERS}' both go to table orders", "differ in mode",
      'table = "..."']),
    ({"table": "x_{schema}", "sink_topics": {ORDERS: {"evolve": "add_columns"}}},
     ["both go to table x_public", "differ in evolve"]),
])
def test_a_bad_route_is_one_line_exit_2_naming_the_key_and_the_fix(kwargs, named):
    message = config_error(**kwargs)
    for part in named:
        assert part in message, message


def test_kafka_names_its_topics_by_a_list_or_a_pattern_never_both():
    for kafka, named in ([{"topics": ["a"], "topic_pattern": "a"}, "keep one"],
                         [{}, "needs exactly one of 'kafka.topics'"],
                         [{"topic_pattern": "("}, "'kafka.topic_pattern' = '(' is not a "
                                                  "regular expression"]):
        with pytest.raises(ConfigError) as e:
            parse_settings({"pipeline": {"name": "p1"},
                            "kafka": {"bootstrap_servers": "h:9092", **kafka},
                            "database": {"url": "postgresql://u:pw@h/db"},
                            "sink": {"format": "raw", "table": "t"}}, environ={})
        assert named in e.value.message and "\n" not in e.value.message


def test_a_pattern_matches_whole_names_and_never_an_internal_topic():
    k = KafkaSettings("h:9092", (), topic_pattern=r"shop\.public\..*")
    assert k.select([ORDERS, LINES, "shop.public", "xshop.public.a", "shop.public.a.b",
                     "_schemas", "__consumer_offsets"]) == ["shop.public.a.b", LINES, ORDERS]
    assert not KafkaSettings("h:9092", (), topic_pattern=".*").matches("__consumer_offsets")
    assert KafkaSettings("h:9092", ("a",)).matches("a")


def test_a_pattern_pipelines_overrides_must_name_topics_it_can_match():
    s = settings(pattern=r"shop\.public\..*", sink_topics={LINES: {"table": "lines"}})
    assert s.routes.for_topic(LINES).table == "lines"
    assert s.routes.for_topic("shop.public.customers").table == "customers"
    message = config_error(pattern=r"shop\.public\..*", sink_topics={"other.x.y": {}})
    assert "kafka.topic_pattern" in message and '[sink.topics."other.x.y"]' in message


def test_a_template_is_checked_when_the_config_is_read():
    assert check_template("{prefix}_{schema}_{table}") == "{prefix}_{schema}_{table}"
    assert check_template("events") == "events"


def test_a_per_table_command_works_on_each_table_or_the_one_named():
    from pipeline.driver.routing import table_scopes

    s = settings()
    assert [(x.table, x.topics, x.settings.sink.table, x.settings.kafka.topics)
            for x in table_scopes(s, s.kafka.topics)] == [
        ("order_lines", (LINES,), "order_lines", (LINES,)),
        ("orders", (ORDERS,), "orders", (ORDERS,))]
    assert [x.table for x in table_scopes(s, s.kafka.topics, topic=ORDERS)] == ["orders"]
    with pytest.raises(ConfigError, match=r"--table nope: no topic of pipeline 'p1' goes to it "
                                          r"\(its tables: order_lines, orders\)"):
        table_scopes(s, s.kafka.topics, table="nope")
    one = settings(table="events")  # a pipeline of one table: as it always was
    assert [(x.table, x.topics, x.settings) for x in table_scopes(one, one.kafka.topics)] == [
        ("events", None, one)]


def test_columns_from_the_writers_schema_is_for_a_pipeline_of_one_table_for_now():
    debezium = {"envelope": "debezium", "mode": "upsert", "columns": "schema"}
    message = config_error(**debezium)  # table = "{table}": a table per topic
    assert '[sink] columns = "schema" with a table per topic' in message
    assert "declare each table's columns" in message
    assert settings(table="replica", **debezium).routes.one_table == "replica"
