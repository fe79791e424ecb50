"""Transformed upsert and aggregate runs killed (SIGKILL of the CLI's whole process tree) at
each fault point, then rerun: before and after the rerun the table equals a recomputation
from the committed Kafka records through the same transform (the newest transformed row per
key; the totals of the transform's output), nothing applied half or twice.

One topic and one pipeline per mode, shared by its fault points (each case adds its own
records): a case is one killed CLI run and one rerun in-process."""

from __future__ import annotations

import os

import pytest

from pipeline import faults
from pipeline.config import load_settings
from tests.helpers import create_topic, unique
from tests.integration._sink_modes import (
    aggregate_config,
    assert_same,
    expected_state,
    expected_totals,
    killed_then_rerun,
    table_state,
    table_totals,
    upsert_config,
)

TRANSFORMS = "tests.integration.transforms.orders"


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory, stack):
    """mode -> (settings, topic, config path): created once, on first use."""
    made: dict[str, tuple] = {}

    def get(mode: str) -> tuple:
        if mode not in made:
            name = unique(f"tk{mode[:3]}")
            topic = create_topic(name, 2)
            folder = tmp_path_factory.mktemp(name)
            if mode == "upsert":  # a derived column; a tombstone is a dead letter
                config = upsert_config(
                    folder, name, topic, f'tombstones = "dead_letter"\ntransform = '
                    f'"{TRANSFORMS}:label_status"\n', columns='status = "string"\nlabel = "string"')
            else:  # a filter: orders whose id is a multiple of 3 are not counted
                config = aggregate_config(folder, name, topic,
                                          f'transform = "{TRANSFORMS}:skip_every_third_order"\n')
            made[mode] = (load_settings(config, environ={}), topic, config)
        return made[mode]

    return get


def assert_exact(mode: str, settings, topic: str) -> dict:
    """The table equals the transform applied to the committed Kafka records, then the
    sink's rule: the newest labelled row per key (label_status; tombstones are dead
    letters, not rows), or the totals of the orders skip_every_third_order keeps."""
    if mode == "upsert":
        return assert_same(expected_state(settings, topic, label=True, tombstones_delete=False),
                           table_state(settings.sink.table, label=True))
    return assert_same(expected_totals(settings, topic, lambda doc: doc["order_id"] % 3),
                       table_totals(settings.sink.table))


# The points where the transform path differs from the built-in one: its read and staging
# (the read tasks' and the writers' mapInArrow into the staging table) and the publish of what it
# staged. The other points (after_plan, after_stage, after_commit) run the same code for
# both paths; test_sink_modes kills every mode there. Each case is a CLI run with a JVM
# start: all six points for both modes cost the suite ~6 more minutes for no new path
# (PIPELINE_TEST_EVERY_POINT=1 runs them all).
KILLED_AT = (faults.POINTS if os.environ.get("PIPELINE_TEST_EVERY_POINT") else
             ("during_read", "after_task_commit", "before_commit"))


@pytest.mark.parametrize("point", KILLED_AT)
@pytest.mark.parametrize("mode", ["upsert", "aggregate"])
def test_a_transformed_run_killed_at_each_fault_point_then_rerun_is_exact(
        spark, pipelines, mode, point):
    settings, topic, config = pipelines(mode)
    # New keys and updates of the previous case's keys (new versions), and for the upsert
    # tombstones (dead letters), so that every case has something to apply.
    killed_then_rerun(settings, topic, config, point, faults.POINTS.index(point),
                      mode == "upsert", lambda: assert_exact(mode, settings, topic))
