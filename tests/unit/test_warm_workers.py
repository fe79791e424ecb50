"""The Python workers' warm-up job is a side show: its failure never fails a run, and its
worker keeps pandas out as the read tasks' workers do (so they reuse it)."""

import logging

from pipeline.executor.transform.worker_imports import NO_PANDAS
from pipeline.spark.warm_workers import start_python_workers


class _Context:
    def __init__(self):
        self.properties = {}

    def setLocalProperty(self, key, value):
        self.properties[key] = value


class _Session:
    """A session whose one job is recorded (or refused: a daemon that cannot start)."""

    def __init__(self, refuse=False):
        self.sparkContext, self.refuse, self.jobs = _Context(), refuse, []

    def range(self, *args):
        if self.refuse:
            raise RuntimeError("Python worker exited unexpectedly")
        session = self

        class _Frame:
            def mapInArrow(self, f, schema):
                session.jobs.append((args, schema, list(f(iter([]))),
                                     dict(session.sparkContext.properties)))
                return self

            def collect(self):
                return []

        return _Frame()


def test_warm_up_failure_is_logged_not_raised(caplog):
    with caplog.at_level(logging.DEBUG, logger="pipeline"):
        start_python_workers(_Session(refuse=True)).join(5)
    assert "warming Spark's Python workers failed" in caplog.text


def test_warm_up_is_one_task_without_pandas_that_returns_nothing():
    spark = _Session()
    start_python_workers(spark).join(5)
    assert spark.jobs == [((0, 1, 1, 1), "id long", [], {NO_PANDAS: "true"})]
