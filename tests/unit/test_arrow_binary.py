"""Which transforms' rows may be COPY binary tuples (executor/transform/arrow_binary.exact): a Spark
type that Postgres takes as it is, else the run's rows stay COPY text; the real-Postgres
comparison is tests/integration/test_arrow_binary.py."""

from decimal import Decimal

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from pipeline.executor.transform.arrow_binary import exact, tuples


@pytest.mark.parametrize(("pg", "spark"), [
    ("bigint", "bigint"), ("bigint", "int"), ("bigint", "tinyint"), ("integer", "smallint"),
    ("smallint", "smallint"), ("double precision", "double"), ("real", "float"),
    ("boolean", "boolean"), ("text", "string"), ("timestamp with time zone", "timestamp"),
    ("timestamp with time zone", "timestamp_ntz"), ("date", "date"), ("bytea", "binary"),
    ("numeric(12,2)", "decimal(12,2)"), ("numeric(12,2)", "decimal(18,2)"),
    ("numeric(18,18)", "decimal(18,18)")])
def test_types_postgres_takes_as_they_are(pg, spark):
    assert exact([("integer", "int"), (pg, spark)])


@pytest.mark.parametrize(("pg", "spark"), [
    ("integer", "bigint"), ("smallint", "int"), ("double precision", "float"),
    ("double precision", "bigint"), ("real", "double"), ("text", "int"),
    ("text", "timestamp"), ("timestamp with time zone", "string"),
    ("timestamp with time zone", "date"), ("date", "timestamp"), ("bytea", "string"),
    ("numeric(12,2)", "double"), ("numeric(12,2)", "decimal(12,3)"),
    ("numeric(12,2)", "decimal(19,2)"), ("numeric(20,2)", "decimal(20,2)"),
    ("numeric(38,2)", "decimal(12,2)"), ("jsonb", "string"), ("text[]", "array<string>"),
    ("bigint[]", "array<bigint>")])
def test_anything_else_keeps_the_run_on_copy_text(pg, spark):
    assert not exact([("integer", "int"), (pg, spark)])


def test_a_decimal_wider_than_an_int64_is_refused_not_wrapped():
    batch = pa.RecordBatch.from_pydict({"amount": pa.array([Decimal("1" + "0" * 20)],
                                                           pa.decimal128(30, 2))})
    with pytest.raises(ValueError, match="more than 18 digits"):
        tuples(batch, [("amount", "numeric(12,2)")], 7, pa, pc)
