"""The speed tricks that lean on private pyspark, py4j and CPython behaviour fall back to
the plain path when that behaviour is gone or different: a real run still writes exactly
its rows. Each thing is broken the way a newer or patched release could break it:

- CLI (a sitecustomize in every process of the run: driver, Spark's daemon, workers):
  ``zipimporter.invalidate_caches`` gone (executor/zip_imports.py), ``pyspark.daemon``
  without ``manager`` and zipimport's directory cache refusing ``pop``
  (executor/daemon.py), the driver's gateway without ``proc`` (spark/driver_jvm.py,
  the class archive) and a Dataset without ``queryExecution`` (executor/transform/worker_imports.py,
  spark/topic_literal.py, spark/transform.py);
- in process: py4j without ``INPUT_CONVERTER`` (spark/numpy_converter.py).
"""

from __future__ import annotations

from decimal import Decimal

import pytest

from pipeline.driver.job import run_ingest
from tests.helpers import (
    ROOT,
    create_topic,
    init_cli,
    init_db,
    make_settings,
    produce_orders,
    query,
    run_cli,
    stored_offsets,
    toml_config,
    unique,
    watermarks,
    write_config,
)

SITECUSTOMIZE = '''
import importlib.abc, importlib.util, sys, zipimport

# CPython without the method executor/zip_imports.py patches
del zipimport.zipimporter.invalidate_caches


class _Refusing(dict):
    def pop(self, *args):
        raise RuntimeError("this zipimport's directory cache is not a plain dict")


zipimport._zip_directory_cache = _Refusing(zipimport._zip_directory_cache)


class _Hook(importlib.abc.MetaPathFinder):
    """After a module is imported, takes away what a newer release may not have."""
    GONE = {"pyspark.daemon": "manager"}

    def find_spec(self, name, path=None, target=None):
        if name not in self.GONE:
            return None
        sys.meta_path.remove(self)
        try:
            spec = importlib.util.find_spec(name)
        finally:
            sys.meta_path.insert(0, self)
        inner, gone = spec.loader, self.GONE[name]

        class Loader(importlib.abc.Loader):
            def __getattr__(self, attribute):  # get_code, ...: runpy runs the module
                return getattr(inner, attribute)

            def create_module(self, spec):
                return inner.create_module(spec)

            def exec_module(self, module):
                inner.exec_module(module)
                delattr(module, gone)

        spec.loader = Loader()
        return spec


sys.meta_path.insert(0, _Hook())

if "PYTHON_WORKER_FACTORY_SECRET" not in __import__("os").environ:  # the driver
    import importlib

    import py4j.java_gateway
    import pyspark.java_gateway

    launch = pyspark.java_gateway.launch_gateway

    def launch_without_proc(*args, **kwargs):
        gateway = launch(*args, **kwargs)
        del gateway.proc  # a pyspark that keeps its JVM's process elsewhere
        return gateway

    pyspark.java_gateway.launch_gateway = launch_without_proc
    for where in ("pyspark.core.context", "pyspark.context"):  # Spark 4, Spark 3.5
        try:
            importlib.import_module(where).launch_gateway = launch_without_proc
        except ImportError:
            pass

    member = py4j.java_gateway.JavaObject.__getattr__

    def no_query_execution(self, name):
        if name == "queryExecution":
            raise AttributeError("this Spark's Dataset has no queryExecution")
        return member(self, name)

    py4j.java_gateway.JavaObject.__getattr__ = no_query_execution
'''


def expected_rows(ids) -> list[tuple]:
    """tests/integration/transforms/orders.double_amount of pipeline.sample's orders."""
    return [(i, Decimal(str(round(i * 1.25, 2))) * 2) for i in ids if i % 10 != 0]


@pytest.mark.slow
def test_a_transform_run_with_the_private_apis_broken_still_writes_exactly_its_rows(
        stack, tmp_path):
    name = unique("private")
    create_topic(name, partitions=2)
    produce_orders(name, range(60))
    config = write_config(tmp_path / "p.toml", toml_config(
        name, [name], extra_sink='transform = "tests.integration.transforms.orders:'
                                 'double_amount"') + "class_archive = false\n")
    init_cli(config)
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(SITECUSTOMIZE)

    proc = run_cli("run", "--config", str(config), env={"PYTHONPATH": f"{site}:{ROOT}"})

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert query(f"SELECT order_id, amount FROM {name} ORDER BY order_id") == expected_rows(
        range(60))
    assert query(f"SELECT count(DISTINCT topic) FROM {name}") == [(1,)]
    assert stored_offsets(name) == {(name, p): high for p, (_, high) in watermarks(name).items()}


def test_a_run_with_py4j_without_its_converter_list_still_writes_its_rows(spark, monkeypatch):
    from py4j import protocol

    topic = create_topic(unique("no_converters"), 1)
    produce_orders(topic, range(20))
    settings = init_db(make_settings(unique("no_converters"), [topic]))
    monkeypatch.delattr(protocol, "INPUT_CONVERTER")  # spark/numpy_converter.install's

    assert run_ingest(settings).status == "succeeded"
    assert query(f"SELECT count(*), sum(order_id) FROM {settings.sink.table}") == [
        (20, sum(range(20)))]
