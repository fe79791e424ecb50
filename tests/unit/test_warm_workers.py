"""The Python daemon's warm-up job is a side show: its failure never fails a run."""

import logging

from pipeline.spark.warm_workers import start_python_workers


class _RefusingContext:
    """A SparkContext whose jobs cannot start (the fault: a daemon that cannot run)."""

    def parallelize(self, *_args):
        raise RuntimeError("Python worker exited unexpectedly")


class _CountingContext:
    def __init__(self):
        self.jobs = []

    def parallelize(self, data, slices):
        context = self

        class _Rdd:
            def mapPartitions(self, f):
                context.jobs.append((list(data), slices, list(f(iter(data)))))
                return self

            def collect(self):
                return []

        return _Rdd()


def test_warm_up_failure_is_logged_not_raised(caplog):
    with caplog.at_level(logging.DEBUG, logger="pipeline"):
        start_python_workers(_RefusingContext()).join(5)
    assert "warming Spark's Python workers failed" in caplog.text


def test_warm_up_runs_one_task_that_returns_nothing():
    sc = _CountingContext()
    start_python_workers(sc).join(5)
    assert sc.jobs == [([0], 1, [])]
