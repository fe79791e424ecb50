"""Transformed upsert and aggregate runs killed (SIGKILL of the CLI's whole process tree) at
each fault point, then rerun: before and after the rerun the table equals a recomputation
from the committed Kafka records through the same transform (the newest transformed row per
key; the totals of the transform's output), nothing applied half or twice.

One topic and one pipeline per mode, shared by its fault points (each case adds its own
records): a case is one killed CLI run and one rerun in-process."""

from __future__ import annotations

import json
import os
import signal
from collections import defaultdict
from decimal import Decimal

import pytest

from pipeline import faults
from pipeline.config import load_settings
from pipeline.driver.job import run_ingest
from tests.helpers import (
    create_topic,
    init_cli,
    produce,
    query,
    toml_config,
    unique,
    watermarks,
)
from tests.integration._reliability import finish, start_cli
from tests.integration.test_sink_modes import (
    AGGREGATE,
    committed,
    event,
    kafka_log,
    newest_per_key,
    tombstone,
)

TRANSFORMS = "tests.integration.transforms.orders"
SINKS = {
    # A derived column; a tombstone is a dead letter under a transform.
    "upsert": (f'mode = "upsert"\nkey = ["order_id"]\ntombstones = "dead_letter"\n'
               f'transform = "{TRANSFORMS}:label_status"'),
    # A filter: orders whose id is a multiple of 3 are not counted.
    "aggregate": (f'mode = "aggregate"\ngroup_by = ["customer"]\n'
                  f'transform = "{TRANSFORMS}:skip_every_third_order"\n[sink.aggregates]\n'
                  + "".join(f'{k} = "{v}"\n' for k, v in AGGREGATE["aggregates"].items())),
}


@pytest.fixture(scope="module")
def pipelines(tmp_path_factory, stack):
    """mode -> (settings, topic, config path): created once, on first use."""
    made: dict[str, tuple] = {}

    def get(mode: str) -> tuple:
        if mode not in made:
            name = unique(f"tk{mode[:3]}")
            topic = create_topic(name, 2)
            config = tmp_path_factory.mktemp(name) / f"{name}.toml"
            text = toml_config(name, [topic], extra_sink=SINKS[mode])
            if mode == "upsert":
                text = text.replace('order_id = "long not null"',
                                    'order_id = "long"\nstatus = "string"\nlabel = "string"')
            config.write_text(text)
            init_cli(config)
            made[mode] = (load_settings(config, environ={}), topic, str(config))
        return made[mode]

    return get


def expected(mode: str, settings, topic: str) -> dict:
    """The transform applied to the committed Kafka records, then the sink's rule."""
    log = kafka_log(topic, committed(settings, topic))
    if mode == "upsert":  # label_status; tombstones are dead letters: not rows
        newest = newest_per_key([(int(key), partition, offset, ts, value)
                                 for partition, offset, key, value, ts in log
                                 if value is not None])
        out = {}
        for order_id, (_, partition, offset, _, value) in newest.items():
            doc = json.loads(value)
            amount = None if doc["amount"] is None else Decimal(doc["amount"])
            out[order_id] = (doc["status"], amount, partition, offset, doc["status"].upper())
        return out
    groups: dict[str, list] = defaultdict(list)  # skip_every_third_order
    for _, _, _, value, _ in log:
        doc = json.loads(value)
        if doc["order_id"] % 3:
            groups[doc["customer"]].append(None if doc["amount"] is None
                                           else Decimal(doc["amount"]))
    out = {}
    for customer, amounts in groups.items():
        priced = [a for a in amounts if a is not None]
        out[customer] = (len(amounts), sum(priced) if priced else None,
                         min(priced, default=None), max(priced, default=None), len(priced))
    return out


def table(mode: str, name: str) -> dict:
    sql = (f'SELECT order_id, status, amount, "partition", "offset", label FROM {name}'
           if mode == "upsert" else
           f"SELECT customer, orders, total, smallest, biggest, priced FROM {name}")
    return {r[0]: tuple(r[1:]) for r in query(sql)}


def assert_exact(mode: str, settings, topic: str) -> dict:
    want, got = expected(mode, settings, topic), table(mode, settings.sink.table)
    wrong = {k: (want.get(k), got.get(k)) for k in set(want) | set(got)
             if want.get(k) != got.get(k)}
    assert not wrong, \
        f"{len(wrong)} of {len(want)} differ (expected, actual): {list(wrong.items())[:5]}"
    return want


# The points where the transform path differs from the built-in one: its read and staging
# (Spark's Kafka source, mapInArrow into the staging table) and the publish of what it
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
    n = faults.POINTS.index(point)
    records = [event(k, n) for k in range(n * 50, n * 50 + 300)]
    if mode == "upsert":
        records += [tombstone(k) for k in range(n * 50, n * 50 + 300, 7)]
    produce(topic, records)
    before = committed(settings, topic)
    ends = {p: hi for p, (_, hi) in watermarks(topic).items()}
    code, _, err = finish(start_cli("run", "--config", config,
                                    env={"PIPELINE_FAULT": f"{point}:kill"}))
    assert code == -signal.SIGKILL, (point, err[-2000:])
    assert committed(settings, topic) == (ends if point == "after_commit" else before)
    assert_exact(mode, settings, topic)
    assert run_ingest(settings).status == ("noop" if point == "after_commit" else "succeeded")
    assert committed(settings, topic) == ends
    assert assert_exact(mode, settings, topic)  # and the table holds something
