"""reconcile.offset_unexplained: a stored offset is what the run it names set, or verify
says why not (a row edited by hand or forged)."""

from pipeline.driver.reconcile import offset_unexplained

TP = ("orders", 0)
INGEST = {"kind": "ingest", "status": "succeeded", "details": {},
          "planned": [{"topic": "orders", "partition": 0, "from": 10, "until": 30},
                      {"topic": "orders", "partition": 1, "from": 0, "until": 5}]}
OFFSETS = {"kind": "offsets", "status": "succeeded", "planned": [],
           "details": {"changes": [{"topic": "orders", "partition": 0, "old": 30,
                                    "new": 50}]}}


def test_the_end_of_the_writers_planned_range_is_explained():
    assert offset_unexplained(TP, 30, 7, INGEST) is None


def test_an_operators_offsets_change_is_explained():
    assert offset_unexplained(TP, 50, 8, OFFSETS) is None


def test_an_offset_moved_past_the_writers_range_is_named():
    why = offset_unexplained(TP, 35, 7, INGEST)
    assert why == ("stored offset 35, but run 7 (ingest) set it to 30 (its planned "
                   "range's end)")


def test_a_writer_that_did_not_set_the_partition_or_did_not_succeed_is_named():
    assert "did not set this partition" in offset_unexplained(("orders", 2), 5, 7, INGEST)
    failed = {**INGEST, "status": "failed"}
    assert "did not succeed (failed)" in offset_unexplained(TP, 30, 7, failed)
    assert "not in pipeline_runs" in offset_unexplained(TP, 30, 99, None)


def test_a_row_without_a_writer_is_not_judged():
    assert offset_unexplained(TP, 123, None, None) is None
