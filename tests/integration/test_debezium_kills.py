"""Debezium change events under crashes: a generated stream of snapshot reads, creates,
updates and deletes (each delete followed by its tombstone, Debezium's default) over 1,000
keys, in Kafka Connect's JSON schema envelope, produced in batches; after each batch a CLI
run SIGKILLed (its whole process tree) at a fault point, then a clean rerun. The expected
table is the source table's state, kept by the generator itself (not read back from Kafka):
after a kill it is the state the committed offsets stand for, after the rerun the final one.
At the end the offsets are at the end of the topic, and a replay from earliest (`pipeline
offsets set --to earliest`, then a run that reads the whole topic again) changes nothing."""

from __future__ import annotations

import os
import random
import signal
from datetime import timedelta
from decimal import Decimal

import pytest

from pipeline import faults
from pipeline.config import load_settings
from pipeline.driver.job import run_ingest
from tests.helpers import (
    BOOTSTRAP,
    create_topic,
    init_cli,
    produce,
    query,
    stored_offsets,
    toml_config,
    unique,
    watermarks,
)
from tests.integration._reliability import finish, start_cli
from tests.integration.test_debezium import COLUMNS, T0, expected, record

pytestmark = pytest.mark.integration

KEYS = 1000
# The points test_transform_kills kills by default: inside a Spark task while it stages,
# after a task's staging commit, inside the publishing transaction before COMMIT (each
# killed run starts a JVM: ~20 s). PIPELINE_TEST_EVERY_POINT=1: all six, after_commit
# (the rerun finds nothing to do) among them.
KILLED_AT = (faults.POINTS if os.environ.get("PIPELINE_TEST_EVERY_POINT") else
             ("during_read", "after_task_commit", "before_commit"))


def changes(rng: random.Random, state: dict[int, dict], n: int, start: int) -> list:
    """n change events against ``state`` (the source table), which they update: a create
    of an absent key (a snapshot read in the first batch), else an update (70 %) or a
    delete and its tombstone. Every key in the schema envelope."""
    out = []
    for step in range(start, start + n):
        k = step if start == 0 else rng.randrange(KEYS)  # the snapshot: every key once
        row = {"id": k, "name": f"n{k}-{step}",
               "updated_at": T0 + timedelta(milliseconds=7 * step),
               "price": Decimal(rng.randrange(-10**6, 10**6)).scaleb(-2),
               "address": {"city": f"c{step % 9}"} if step % 4 else None}
        old = state.get(k)
        if old is None:
            out.append(record(k, "r" if start == 0 else "c", None, row, True))
            state[k] = row
        elif rng.random() < 0.7:
            out.append(record(k, "u", old, row, True))
            state[k] = row
        else:
            key, value = record(k, "d", old, None, True)
            out += [(key, value), (key, None)]
            del state[k]
    return out


def test_a_debezium_stream_killed_between_batches_lands_as_the_final_state_and_a_replay_is_a_noop(
        spark, tmp_path, monkeypatch):
    from pipeline.cli import main as cli_main

    rng = random.Random(2626)
    name = unique("dbzk")
    topic = create_topic(name, 2)
    config = tmp_path / f"{name}.toml"
    columns = "".join(f"{c} = {t!r}\n" if isinstance(t, str) else
                      f'{c} = {{ type = "{t["type"]}", from = "{t["from"]}" }}\n'
                      for c, t in COLUMNS.items())
    text = toml_config(name, [topic], extra_sink='envelope = "debezium"\nmode = "upsert"\n'
                       'key = ["id"]')
    config.write_text(text.split("[sink.columns]")[0] + "[sink.columns]\n" + columns
                      + "[spark]\nmaster = \"local[2]\"\n")
    init_cli(config)
    settings = load_settings(config, environ={})
    select = f"SELECT id, name, updated_at, price, city FROM {name} ORDER BY id"
    dead = "SELECT count(*) FROM pipeline_dead_letters WHERE pipeline = %s"

    state: dict[int, dict] = {}
    batches: list[list] = []
    for n, point in enumerate(KILLED_AT):
        committed_state = expected(state)  # what the committed offsets stand for
        # The snapshot (every key), then changes of random keys.
        batches.append(changes(rng, state, 1500, KEYS + 1500 * (n - 1)) if n else
                       changes(rng, state, KEYS, 0))
        produce(topic, batches[-1])
        before = stored_offsets(name)
        ends = {(topic, p): hi for p, (_, hi) in watermarks(topic).items()}
        code, _, err = finish(start_cli("run", "--config", str(config),
                                        env={"PIPELINE_FAULT": f"{point}:kill"}))
        assert code == -signal.SIGKILL, (point, err[-2000:])
        if point == "after_commit":
            assert stored_offsets(name) == ends
            assert query(select) == expected(state)
        else:
            assert stored_offsets(name) == before
            assert query(select) == committed_state, f"after a kill at {point}"
        rerun = run_ingest(settings)
        assert rerun.status == ("noop" if point == "after_commit" else "succeeded"), point
        assert rerun.dead_letters == 0
        assert stored_offsets(name) == ends
        assert query(select) == expected(state), f"after the rerun of a kill at {point}"
    tombstones = sum(value is None for batch in batches for _, value in batch)
    assert tombstones > 300 and 0 < len(state) < KEYS  # deletes were exercised
    deleted = set(range(KEYS)) - set(state)
    assert not deleted & {r[0] for r in query(f"SELECT id FROM {name}")}
    assert query(dead, (name,)) == [(0,)]

    # A replay from earliest: the whole topic read again, not one row or deletion written.
    def snapshot() -> tuple:
        return (query(f"SELECT *, xmin::text FROM {name} ORDER BY id"),
                query(f"SELECT *, xmin::text FROM {name}_deleted ORDER BY id"))

    before = snapshot()
    monkeypatch.setenv("PIPELINE__KAFKA__BOOTSTRAP_SERVERS", BOOTSTRAP)
    for old in ("KAFKA_BOOTSTRAP_SERVERS", "PIPELINE_DATABASE_URL", "PIPELINE__DATABASE__URL"):
        monkeypatch.delenv(old, raising=False)
    assert cli_main(["offsets", "set", "--topic", topic, "--to", "earliest",
                     "--config", str(config), "--yes"]) == 0
    assert stored_offsets(name) == {(topic, p): 0 for p in range(2)}
    replay = run_ingest(settings)
    assert replay.records_read == sum(ends.values()) == sum(map(len, batches))
    assert (replay.rows_written, replay.rows_deleted, replay.dead_letters) == (0, 0, 0)
    assert snapshot() == before
    assert query(select) == expected(state)
    assert stored_offsets(name) == ends
