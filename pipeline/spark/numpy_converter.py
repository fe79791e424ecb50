"""pyspark's py4j input converters for numpy values, asked only about numpy values.

pyspark.sql.types registers ``NumpyScalarConverter`` and ``NumpyArrayConverter`` with py4j
(``py4j.protocol.register_input_converter``), and py4j asks every input converter about
every argument of every JVM call. Each one's ``can_convert`` first imports
``pyspark.testing.utils`` to learn whether numpy is installed, and that module imports
pandas, grpc and pyspark's test helpers: ~0.5 s and ~50 MB of the driver's memory at the
first JVM call with an argument (``SparkConf()`` in SparkContext's init), in every run,
though the built-in sinks' driver never touches pandas (docs/benchmarks.md).

An object can only be a numpy value if numpy is imported already, so the wrapper asks
that first and hands numpy values (a user transform's ``F.lit(np.int64(1))``) to
pyspark's own converter, as before. If a pyspark release registers no such converter,
nothing changes; if py4j keeps its converters elsewhere, or anything else is unexpected,
nothing is wrapped (the plain path: slower, the same values).
"""

from __future__ import annotations

import sys

CONVERTERS = ("NumpyScalarConverter", "NumpyArrayConverter")  # pyspark.sql.types, 3.x, 4.x


class NumpyOnlyConverter:
    """``inner`` (one of pyspark's), consulted for numpy values only."""

    def __init__(self, inner) -> None:
        self.inner = inner

    def can_convert(self, obj) -> bool:
        np = sys.modules.get("numpy")
        return (np is not None and isinstance(obj, (np.ndarray, np.generic))
                and self.inner.can_convert(obj))

    def convert(self, obj, gateway_client):
        return self.inner.convert(obj, gateway_client)


def install(converters: list | None = None) -> int:
    """Wrap pyspark's numpy converters in py4j's list (``converters``: that list unless
    given), once; how many were wrapped now. Never raises."""
    try:
        return _install(converters)
    except Exception:  # noqa: BLE001 - py4j's own converters stay, as pyspark set them
        return 0


def _install(converters: list | None) -> int:
    if converters is None:
        import pyspark.sql.types  # noqa: F401 - registers pyspark's converters
        from py4j import protocol

        converters = protocol.INPUT_CONVERTER
    wrapped = 0
    for i, converter in enumerate(list(converters)):
        if type(converter).__name__ in CONVERTERS:
            converters[i] = NumpyOnlyConverter(converter)
            wrapped += 1
    return wrapped
