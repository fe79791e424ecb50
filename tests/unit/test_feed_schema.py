"""The DataFrame a transform receives (executor/transform/feed.feed_schema): with its topic, and
without it for a run of one topic, whose driver adds it back as a literal first."""

from pipeline.executor.transform.feed import feed_schema

COLUMNS = [("order_id", "long", True, None), ("amount", "decimal(12,2)", False, None)]


def test_a_run_of_one_topic_reads_every_column_but_the_topic_first():
    assert feed_schema("json", COLUMNS) == (
        "topic string, partition int, offset bigint, kafka_timestamp timestamp, "
        "`order_id` bigint, `amount` decimal(12,2)")
    assert feed_schema("json", COLUMNS, topic=False) == (
        "partition int, offset bigint, kafka_timestamp timestamp, "
        "`order_id` bigint, `amount` decimal(12,2)")
    assert feed_schema("raw", [], topic=False) == (
        "partition int, offset bigint, key binary, value binary, headers string, "
        "kafka_timestamp timestamp")
    assert feed_schema("raw", []) == "topic string, " + feed_schema("raw", [], topic=False)
