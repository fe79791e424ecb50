"""A transform's output against its sink's contract (spark/transform.check_output), from
the output's column names alone: what the driver checks before anything is read."""

import pytest

from pipeline.errors import ConfigError
from pipeline.spark.transform import check_output, result_names
from tests.unit.test_sink_modes import settings

UPSERT = {"mode": "upsert", "key": ["order_id"], "tombstones": "dead_letter",
          "transform": "m:f"}
AGGREGATE = {"mode": "aggregate", "group_by": ["region"], "aggregates": {"n": "count(*)"},
             "transform": "m:f"}


def without(sink, *names) -> list[str]:
    return [c for c in result_names(sink) if c not in names]


@pytest.mark.parametrize("mode", [{"transform": "m:f"}, UPSERT, AGGREGATE])
def test_every_staged_column_kept_plus_new_ones_passes(mode):
    sink = settings(**mode).sink
    check_output([*result_names(sink), "derived"], sink)


@pytest.mark.parametrize("mode, dropped, names", [
    (UPSERT, ["order_id"], ["upsert key column 'order_id'"]),
    (AGGREGATE, ["region"], ["aggregate group_by column 'region'"]),
    (UPSERT, ["kafka_timestamp"], ["'kafka_timestamp'", "across partitions"]),
    (AGGREGATE, ["offset"], ["coordinates (topic, partition, offset)"]),
    ({"transform": "m:f"}, ["topic", "partition"], ["coordinates", "missing: topic, partition"]),
    (UPSERT, ["note", "order_id"], ["upsert key column 'order_id'", "missing: order_id, note"]),
    ({"transform": "m:f"}, ["note"], ["'note', a column of the table orders"]),
    (AGGREGATE, ["qty", "region"], ["group_by column 'region'", "missing: region, qty"]),
])
def test_a_dropped_column_is_a_config_error_naming_the_transform_and_it(mode, dropped, names):
    sink = settings(**mode).sink
    with pytest.raises(ConfigError) as e:
        check_output(without(sink, *dropped), sink)
    assert e.value.exit_code == 2
    assert "[sink] transform 'm:f' dropped" in e.value.message
    for name in names:
        assert name in e.value.message, (name, e.value.message)
