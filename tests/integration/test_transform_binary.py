"""A transform's rows reach Postgres as COPY binary tuples (executor/transform/arrow_binary.py) when
every staged column's Spark type is one Postgres takes as it is, else as COPY text lines:
the driver chooses before the job (transform_job.stage_transformed -> Publisher.choose_wire). Either
way a run stores what the built-in path stores from the same records (its COPY text),
column for column, dead letters and ledger rows too."""

from __future__ import annotations

import json
import logging
import re

import pytest

from pipeline.driver.job import run_ingest
from pipeline.driver.publish import Publisher
from tests.helpers import create_topic, init_db, make_settings, produce, query, unique
from tests.integration.test_transform_topic import outcome

IDENTITY = "tests.integration.transforms.orders:identity"
# Every type the tuples cover, from JSON.
COLUMNS = {"n": "long not null", "i": "int", "x": "double", "ok": "boolean",
           "at": "timestamp", "day": "date", "name": "string", "amount": "decimal(12,2)",
           "fine": "decimal(18,6)", "frac": "decimal(4,4)", "whole": "decimal(18,0)"}
VALUES = {
    "i": [0, -1, 2147483647, -2147483648, None],
    "x": [0.0, -0.0, 1.5, -2.25e300, 5e-324, 0.1, None],
    "ok": [True, False, None],
    "at": ["2000-01-01T00:00:00Z", "1969-12-31T23:59:59.999999Z", "0001-01-01T00:00:00Z",
           "9999-12-31T23:59:59.999999Z", "2026-03-08T06:30:00.5+02:00", None],
    "day": ["2000-01-01", "1999-12-31", "1969-12-31", "0001-01-01", "9999-12-31", None],
    "name": ["", "tab\there", "back\\slash", "new\nline", "é ü 日本 😀", "\\N", None],
    "amount": ["0", "0.05", "-0.05", "-9999999999.99", "10000", "0.5", None],
    "fine": ["0", "-0.000001", "123456789012.345678", "10000.0001", None],
    "frac": ["0", "0.0001", "-0.9999", "0.05", None],
    "whole": ["0", "-999999999999999999", "100000000", "999999999999999999", None],
}


def record(j: int) -> bytes:
    """Order j's JSON: each column's j-th edge case, a NULL left out, decimals as the
    numbers written."""
    doc = {"n": j * 7919 - 10**12}
    for name, values in VALUES.items():
        v = values[j % len(values)]
        if v is not None:
            doc[name] = f"__{v}__" if name in ("amount", "fine", "frac", "whole") else v
    return re.sub(r'"__(.*?)__"', r"\1", json.dumps(doc)).encode()


@pytest.fixture
def wires(monkeypatch) -> list[bool]:
    """The wire each transform run's publisher was told: True for binary tuples."""
    chosen: list[bool] = []
    real = Publisher.choose_wire

    def spy(self, binary):
        chosen.append(binary)
        return real(self, binary)

    monkeypatch.setattr(Publisher, "choose_wire", spy)
    return chosen


def _outcome(s) -> tuple[list, list, list]:
    """outcome's, with each row's columns as Postgres prints them (a numeric's display
    scale, which jsonb drops)."""
    rows, dead, ledger = outcome(s)
    text = query(f"SELECT t::text FROM (SELECT topic, \"partition\", \"offset\", "
                 f"kafka_timestamp, {', '.join(COLUMNS)} FROM {s.sink.table}) t "
                 'ORDER BY topic, "partition", "offset"')
    return [(*r, t[0]) for r, t in zip(rows, text, strict=True)], dead, ledger


def _both(topic: str, transform: str, columns=COLUMNS):
    builtin = init_db(make_settings(unique("bin_b"), [topic], sink={"columns": columns}))
    transformed = init_db(make_settings(unique("bin_t"), [topic], sink={
        "columns": columns, "transform": transform}))
    assert run_ingest(builtin).status == "succeeded"
    assert run_ingest(transformed).status == "succeeded"
    return _outcome(builtin), _outcome(transformed)


def test_every_covered_type_as_binary_tuples_stores_what_the_builtin_path_stores(spark, wires,
                                                                                caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    topic = create_topic(unique("bin"), 2)
    produce(topic, [(f"k{j}".encode(), record(j)) for j in range(60)], partition=0)
    produce(topic, [(b"bad", b"{not json"), (b"k", record(61)), (b"none", None)], partition=1)

    (rows, dead, ledger), got = _both(topic, IDENTITY)

    assert wires == [True]
    assert "the transform's rows are staged as COPY binary tuples" in caplog.text
    assert got == (rows, dead, ledger)
    assert len(rows) == 61 and len(dead) == 2
    seen = {k: {r[0][k] for r in rows} for k in ("amount", "name", "frac")}
    assert {-0.05, 0.05, -9999999999.99, None} <= seen["amount"]
    assert {"", "tab\there", "é ü 日本 😀", None} <= seen["name"]
    assert any(",10000.00,-0.000001," in r[1] for r in rows)  # display scales kept


def test_a_column_of_another_type_keeps_the_run_on_copy_text(spark, wires, caplog):
    caplog.set_level(logging.INFO, logger="pipeline")
    # The amount as a double for a decimal column: Postgres parses the double's text (the
    # tuples would need its rounding), so the whole run is text, and stores the same.
    topic = create_topic(unique("bin_text"), 1)
    produce(topic, [(f"k{j}".encode(), record(j)) for j in range(30)])

    (rows, dead, ledger), got = _both(
        topic, "tests.integration.transforms.orders:amount_as_double")

    assert wires == [False]
    assert ("staged as COPY text lines (amount: double into numeric(12,2))"
            in caplog.text), caplog.text[-2000:]
    assert got == (rows, dead, ledger) and len(rows) == 30
