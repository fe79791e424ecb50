"""A [sink] transform for every sink mode (issue 25): an upsert keeps the newest transformed
row per key and an aggregate totals the transform's output exactly once, both equal to a
recomputation from Kafka; a transform that breaks the sink's contract (drops the key, makes
it null) is a clear exit-2 error naming the transform, and nothing commits."""

from __future__ import annotations

import pytest

from pipeline.driver.job import run_ingest
from pipeline.errors import ConfigError
from tests.helpers import (
    create_topic,
    init_db,
    make_settings,
    produce,
    query,
    stored_offsets,
    unique,
)
from tests.integration._sink_modes import (
    AGGREGATE,
    event,
    expected_state,
    expected_totals,
    table_state,
    table_totals,
    tombstone,
    upsert_settings,
)

TRANSFORMS = "tests.integration.transforms.orders"
UPSERT_COLUMNS = {"order_id": "long", "customer": "string not null",
                  "amount": "decimal(12,2)", "status": "string", "label": "string"}


def transformed_upsert(name: str, topic: str, transform: str):
    return upsert_settings(name, topic, columns=UPSERT_COLUMNS, tombstones="dead_letter",
                           transform=f"{TRANSFORMS}:{transform}")


def test_upsert_with_a_transform_keeps_the_newest_transformed_row_per_key(spark):
    name = unique("tups")
    topic = create_topic(name, 2)
    settings = transformed_upsert(name, topic, "label_status")
    produce(topic, [event(k, 0) for k in range(200)])
    assert run_ingest(settings).status == "succeeded"
    # Updates of half the keys, new keys, a key moved to the other partition (the later
    # Kafka timestamp wins) and a tombstone, which is a dead letter under a transform.
    produce(topic, [event(k, 1) for k in range(0, 250, 2)])
    produce(topic, [event(k, 2) for k in range(3)], partition=1)
    produce(topic, [event(k, 3) for k in range(3)], partition=0)
    produce(topic, [tombstone(4)])
    result = run_ingest(settings)
    assert result.status == "succeeded" and result.dead_letters == 1, result

    want = expected_state(settings, topic, label=True, tombstones_delete=False)
    got = table_state(name, label=True)
    assert len(want) == 225 and got == want
    assert {got[k][0] for k in range(3)} == {"v3"} and got[4][0] == "v1"


def test_aggregate_with_a_filtering_transform_totals_its_output_exactly_once(spark):
    name = unique("tagg")
    topic = create_topic(name, 3)
    settings = init_db(make_settings(name, [topic], sink={
        **AGGREGATE, "transform": f"{TRANSFORMS}:skip_every_third_order"}))
    for batch in range(2):
        produce(topic, [event(k, batch) for k in range(batch * 300, batch * 300 + 450)])
        assert run_ingest(settings).status == "succeeded"
    assert run_ingest(settings).status == "noop"

    want = expected_totals(settings, topic, lambda doc: doc["order_id"] % 3)
    got = table_totals(name)
    assert sum(v[0] for v in want.values()) == 600 and got == want


@pytest.mark.parametrize("transform, words", [
    ("drop_order_id", ["dropped the upsert key column 'order_id'", "missing: order_id"]),
    ("order_7_without_id", ["returned a null order_id", "[0] offset 7", "nothing committed"]),
    ("select_a_column_that_is_not_there", ["failed while building its DataFrame",
                                           "no_such_column", "fix the transform"]),
])
def test_a_transform_breaking_the_upsert_contract_is_exit_2_naming_it(spark, transform, words):
    name = unique("tbad")
    topic = create_topic(name, 1)
    settings = transformed_upsert(name, topic, transform)
    produce(topic, [event(k, 0) for k in range(10)], partition=0)
    with pytest.raises(ConfigError) as e:
        run_ingest(settings)
    assert e.value.exit_code == 2
    assert f"[sink] transform '{TRANSFORMS}:{transform}'" in e.value.message, e.value.message
    for word in words:
        assert word in e.value.message, (word, e.value.message)
    assert query(f"SELECT count(*) FROM {name}") == [(0,)] and stored_offsets(name) == {}
    assert query("SELECT status, exit_code FROM pipeline_runs WHERE pipeline = %s "
                 "AND kind = 'ingest'", (name,)) == [("failed", 2)]
