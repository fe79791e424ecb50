"""How a stop is told from a failure (driver/signals.py): a real SIGTERM to this process."""

import os
import signal

import pytest

from pipeline.driver.signals import StopSignals
from pipeline.errors import EXIT_TERMINATED, DataError, SparkStartError, Terminated

START = SparkStartError("Spark did not start with master 'local[2]': An error occurred "
                        "while calling None.org.apache.spark.api.java.JavaSparkContext")


def test_a_spark_start_broken_by_a_stop_signal_is_the_stop():
    with StopSignals() as signals:
        with signals.held():
            os.kill(os.getpid(), signal.SIGTERM)
        stopped = signals.stop_error(START)
        data = DataError("too many bad records")
        assert signals.stop_error(data) is data  # a real failure stays what it is
    assert isinstance(stopped, Terminated) and stopped.exit_code == EXIT_TERMINATED
    assert stopped.message == ("stopped by SIGTERM; nothing committed by this run, safe "
                               "to rerun")


def test_a_spark_start_failure_without_a_stop_is_a_config_error():
    with StopSignals() as signals:
        assert signals.stop_error(START) is START


def test_held_only_records_a_stop_and_then_acts_on_it_again():
    with StopSignals() as signals:
        with signals.held():
            os.kill(os.getpid(), signal.SIGTERM)  # while a failed run is being recorded
        assert signals.received == signal.SIGTERM and not signals.deferred
        with pytest.raises(Terminated):
            os.kill(os.getpid(), signal.SIGTERM)
