"""Letting the driver JVM go at exit (spark/driver_jvm.py) leans on pyspark's private
gateway (its ``proc``, py4j's ``shutdown``): anything unexpected there leaves the plain
path (the JVM exits when this process does), never an error at the run's exit."""

from __future__ import annotations

from pipeline.spark import driver_jvm


class _Broken:
    def __getattr__(self, name):
        raise RuntimeError(f"no {name} in this py4j")


class _Proc:
    pid = 12345
    stdin = None

    def poll(self):
        raise OSError("not the Popen pyspark made")


def test_a_gateway_without_its_process_registers_nothing():
    assert not driver_jvm.release_at_exit(object())  # no _gateway
    assert not driver_jvm.release_at_exit(type("Sc", (), {"_gateway": object()})())  # no proc
    gateway = type("G", (), {"proc": object()})()  # a proc without a pid
    assert not driver_jvm.release_at_exit(type("Sc", (), {"_gateway": gateway})())


def test_release_never_raises_whatever_the_gateway_and_process_do():
    driver_jvm.release(_Broken(), _Proc())  # poll raises: left be

    class Running(_Proc):
        def poll(self):
            return None

    driver_jvm.release(_Broken(), Running())  # shutdown and stdin raise: logged only
