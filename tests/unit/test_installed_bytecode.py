"""The venvs scripts/stack installs carry their modules' bytecode, as pip leaves them: uv
does not compile at install, and where PYTHONDONTWRITEBYTECODE is set (CI images) no
process would ever write it, so every Python start compiled its imports again (~3 CPU-s
a job process, measured: 4.3 against 1.3 CPU-s to import the job's libraries)."""

from __future__ import annotations

import importlib.util
import os

import pytest


@pytest.mark.parametrize("module", ["pyspark", "pandas", "pyarrow", "sqlalchemy", "psycopg",
                                    "confluent_kafka", "py4j"])
def test_the_job_venvs_libraries_are_compiled(module):
    spec = importlib.util.find_spec(module)
    assert spec is not None and spec.origin.endswith(".py"), spec
    cached = importlib.util.cache_from_source(spec.origin)
    assert os.path.exists(cached), (
        f"{module} has no bytecode ({cached}): install the venv with scripts/stack, which "
        "compiles it")
