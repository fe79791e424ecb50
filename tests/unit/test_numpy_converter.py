"""pyspark's numpy converters asked only about numpy values (spark/numpy_converter.py):
their can_convert imports pandas, grpc and pyspark's test helpers on the first JVM call."""

import numpy as np

from pipeline.spark.numpy_converter import NumpyOnlyConverter, install


class NumpyArrayConverter:  # the names pyspark.sql.types registers
    def __init__(self):
        self.asked = []

    def can_convert(self, obj):
        self.asked.append(obj)
        return isinstance(obj, np.ndarray)

    def convert(self, obj, gateway_client):
        return ("array", obj.tolist(), gateway_client)


class NumpyScalarConverter(NumpyArrayConverter):
    def can_convert(self, obj):
        self.asked.append(obj)
        return isinstance(obj, np.generic)


class DateConverter:
    def can_convert(self, obj):
        return False


def test_only_pysparks_numpy_converters_are_wrapped_once():
    date, scalar, array = DateConverter(), NumpyScalarConverter(), NumpyArrayConverter()
    converters = [array, date, scalar]
    assert install(converters) == 2
    assert converters[1] is date
    assert [c.inner for c in converters if isinstance(c, NumpyOnlyConverter)] == [array, scalar]
    assert install(converters) == 0  # wrapped already


def test_other_values_never_reach_the_wrapped_converter():
    inner = NumpyArrayConverter()
    wrapped = NumpyOnlyConverter(inner)
    for value in ("spark.master", 3, 2.5, b"x", None, [1, 2], {"a": 1}):
        assert not wrapped.can_convert(value)
    assert inner.asked == []  # pyspark's would import pyspark.testing.utils here


def test_numpy_values_are_converted_by_pysparks_converter():
    array, scalar = NumpyArrayConverter(), NumpyScalarConverter()
    values = np.array([1, 2], dtype="int64")
    assert NumpyOnlyConverter(array).can_convert(values)
    assert NumpyOnlyConverter(array).convert(values, "gw") == ("array", [1, 2], "gw")
    assert NumpyOnlyConverter(scalar).can_convert(np.int64(3))
    assert not NumpyOnlyConverter(scalar).can_convert(values)  # its own answer stands


def test_a_py4j_without_its_converter_list_leaves_the_plain_path(monkeypatch):
    from py4j import protocol

    monkeypatch.delattr(protocol, "INPUT_CONVERTER")
    assert install() == 0  # nothing wrapped, nothing raised: pyspark's converters as set
    assert install((NumpyArrayConverter(),)) == 0  # a list that cannot be changed
