"""A wide topic (200 partitions, a few records each) on the real stack: read exactly in a
few Spark tasks (one consumer and one staging transaction per task, not per partition),
killed at every fault point and rerun exactly, and a run with nothing new that starts no
Spark (issue 29)."""

from __future__ import annotations

import json
import logging

import pytest

from pipeline import faults
from pipeline.driver.backfill import run_backfill
from pipeline.driver.job import run_ingest
from pipeline.plan.offsets import OffsetRange
from tests.helpers import BOOTSTRAP, produce_orders, run_cli
from tests.integration._reliability import (
    assert_exactly_once,
    end_offsets,
    runs,
)
from tests.integration.test_faults import cli_env, is_good, new_pipeline, run_killed_at

PARTITIONS = 200


def wide_pipeline(tmp_path, prefix: str):
    """200 partitions, 5 orders each and a few bad records: most partitions far smaller
    than one consume() batch."""
    return new_pipeline(tmp_path, prefix, orders=5 * PARTITIONS, partitions=PARTITIONS)


def read_tasks(caplog) -> list[int]:
    """The number of Spark tasks of each read, from the runs' read.start events."""
    return [r.tasks for r in caplog.records if getattr(r, "event", None) == "read.start"]


def test_a_200_partition_topic_is_read_exactly_by_one_task_per_core(spark, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    settings, topic, _ = wide_pipeline(tmp_path, "wide_exact")

    result = run_ingest(settings)

    assert result.status == "succeeded", result
    assert result.records_read == 5 * PARTITIONS + 4
    assert_exactly_once(settings, topic, good=is_good, bad=True)
    # local[2]: two tasks, each reading 100 partitions with one consumer, not 200 tasks.
    assert read_tasks(caplog) == [2]

    produce_orders(topic, range(5 * PARTITIONS, 5 * PARTITIONS + 3 * PARTITIONS))
    result = run_ingest(settings)
    assert result.status == "succeeded" and result.records_read == 3 * PARTITIONS
    assert_exactly_once(settings, topic, good=is_good, bad=True)


def test_a_backfill_of_a_wide_topic_reads_every_partition_in_few_tasks(spark, tmp_path,
                                                                       caplog):
    settings, topic, _ = wide_pipeline(tmp_path, "wide_backfill")
    assert run_ingest(settings).status == "succeeded"
    caplog.set_level(logging.INFO, logger="pipeline")
    caplog.clear()  # only the backfill's reads (the logger may be at INFO already)
    whole = [OffsetRange(topic, p, 0, end) for p, end in
             sorted(end_offsets(topic, BOOTSTRAP).items()) if end]

    result = run_backfill(settings, whole)

    assert result.status == "succeeded", result
    assert result.records_read == 5 * PARTITIONS + 4
    assert result.rows_written == 0  # every row was there already: nothing twice
    assert_exactly_once(settings, topic, good=is_good, bad=True)
    assert read_tasks(caplog) == [2]


@pytest.mark.parametrize("point", faults.POINTS)
def test_sigkill_at_each_point_on_a_wide_topic_then_rerun_is_exact(spark, tmp_path, point):
    settings, topic, config = wide_pipeline(tmp_path, f"wide_kill_{point}")
    statuses = run_killed_at(point, settings, topic, config)

    produce_orders(topic, range(5 * PARTITIONS, 6 * PARTITIONS))
    result = run_ingest(settings)
    assert result.status == "succeeded", result
    assert_exactly_once(settings, topic, good=is_good, bad=True)
    assert [r[1] for r in runs(settings.name, settings.database_url)] == statuses


def test_a_run_with_nothing_new_on_a_wide_topic_starts_no_spark(spark, tmp_path):
    settings, topic, config = wide_pipeline(tmp_path, "wide_noop")
    assert run_ingest(settings).status == "succeeded"

    done = run_cli("run", "--config", config, "--json", env=cli_env(settings))

    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads(done.stdout)
    assert summary["status"] == "noop" and summary["records_read"] == 0
    assert "spark_start" not in summary["timings"], summary["timings"]
    assert "spark.start" not in done.stderr
    assert_exactly_once(settings, topic, good=is_good, bad=True)
