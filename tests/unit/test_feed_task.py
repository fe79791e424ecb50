"""A transform's read tasks read in smaller batches, with a smaller queue, than the built-in
path's (consume.FEED_BATCH: each batch is held as Messages, columns and an Arrow batch at
once; git history of docs/benchmarks.md)."""

from pipeline.config import parse_settings
from pipeline.driver.transform_job import feed_task
from pipeline.executor.consume import BATCH, QUEUED_MESSAGES, reader_config


def settings(consumer: dict | None = None):
    return parse_settings({
        "pipeline": {"name": "p"},
        "kafka": {"bootstrap_servers": "k:9092", "topics": ["t"],
                  **({"consumer": consumer} if consumer else {})},
        "database": {"url": "postgresql://h/db"},
        "sink": {"format": "json", "table": "t", "columns": {"id": "long"},
                 "transform": "m:identity"}}, environ={})


def test_the_feed_reads_half_batches_with_a_quarter_of_the_queue():
    feed = feed_task(settings(), None, None, [[]])
    assert (feed.batch, feed.reader["queued.min.messages"]) == (5_000, 5_000)
    assert (feed.batch, feed.reader["queued.min.messages"]) != (BATCH, QUEUED_MESSAGES)
    assert feed.reader["group.id"] == "p-reader"
    # The built-in path's reader is unchanged.
    assert reader_config({}, "read_committed", "g")["queued.min.messages"] == QUEUED_MESSAGES


def test_a_queue_the_user_set_still_wins():
    feed = feed_task(settings({"queued.min.messages": 1000}), None, None, [[]])
    assert int(feed.reader["queued.min.messages"]) == 1000
