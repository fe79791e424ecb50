"""What Publisher.finish returns goes into the run's RunResult as it is."""

from pipeline.driver.job import RunResult
from pipeline.driver.publish import Published


def test_a_published_runs_counts_are_the_run_results_and_its_timings_stay_its_own():
    published = Published(10, 8, 1, 1, {"t[0]": {"rows": 8, "dead": 1, "deletes": 1}},
                          {"publish": 0.5, "total": 2.0})
    result = RunResult("ingest", "succeeded", 3, [], **published.counts(),
                       timings={"total": 2.1})
    assert (result.records_read, result.rows_written, result.rows_deleted,
            result.dead_letters) == (10, 8, 1, 1)
    assert result.per_partition == {"t[0]": {"rows": 8, "dead": 1, "deletes": 1}}
    assert result.timings == {"total": 2.1}
