"""Helpers for the Schema Registry tests of the avro and protobuf formats: a pipeline of
either format reading through ``[schema_registry] url``, what Kafka holds per offset, the
table's rows and dead letters, and the check both make after a run mixing schema versions
with bad records."""

from __future__ import annotations

from pipeline.config import parse_settings
from tests.helpers import BOOTSTRAP, TEST_DB_URL, init_db, query, stored_offsets, watermarks
from tests.integration._reliability import kafka_records


def registry_client(url: str):
    """A test's own registry client, with a timeout: a request whose answer is lost is
    retried (the client retries transport errors) instead of waiting forever (a
    test_avro_registry run hung so on a response the registry never sent)."""
    from confluent_kafka.schema_registry import SchemaRegistryClient

    return SchemaRegistryClient({"url": url, "timeout": 20})


def registry_settings(fmt: str, name: str, topic: str, url: str, columns: dict, **sink):
    """A ``fmt`` (avro, protobuf) pipeline on ``topic`` whose writer schemas come from the
    registry at ``url``; every bad record a dead letter (no limit); its tables made."""
    return init_db(parse_settings({
        "pipeline": {"name": name},
        "kafka": {"bootstrap_servers": BOOTSTRAP, "topics": [topic], "timeout_seconds": 10},
        "database": {"url": TEST_DB_URL},
        "sink": {"format": fmt, "table": name, "max_bad_records": -1, "columns": columns,
                 **sink},
        "schema_registry": {"url": url, "timeout_seconds": 3},
        "spark": {"master": "local[2]"},
    }, source=f"<test {name}>", environ={}))


def by_offset(topic: str, rows_of: dict[bytes, tuple]) -> dict[tuple[int, int], tuple]:
    """What Kafka holds, as (partition, offset) -> the expected row (a value in ``rows_of``)
    or the value itself (a bad record)."""
    return {po: rows_of.get(v, v) for po, (_, v, _, _) in kafka_records(topic, BOOTSTRAP).items()}


def table_rows(name: str, select: str) -> dict[tuple[int, int], tuple]:
    return {(r[0], r[1]): tuple(r[2:]) for r in query(
        f'SELECT "partition", "offset", {select} FROM {name}')}


def dead_letters(name: str) -> dict[tuple[int, int], tuple[str, str, bytes]]:
    return {(p, o): (t, m, bytes(v)) for p, o, t, m, v in query(
        'SELECT "partition", "offset", error_type, error_message, value '
        "FROM pipeline_dead_letters WHERE pipeline = %s", (name,))}


def log_ends(topic: str) -> dict[tuple[str, int], int]:
    return {(topic, p): high for p, (_, high) in watermarks(topic).items()}


def assert_rows_and_dead_letters(name: str, topic: str, select: str,
                                 rows_of: dict[bytes, tuple], bad: dict[bytes, str],
                                 unknown_id: int) -> tuple[dict, dict[str, str]]:
    """Every good record (a value of ``rows_of``) is its row at its offset, every bad one
    (a value of ``bad``, naming its error type) a dead letter at its offset, and the
    offsets are at the log's end; a wrong first byte and ``unknown_id`` are named in their
    reasons. Returns (the dead letters, error type -> reason)."""
    want = by_offset(topic, rows_of)
    assert table_rows(name, select) == {po: r for po, r in want.items() if type(r) is tuple}
    dead = dead_letters(name)
    assert {po: (t, v) for po, (t, _, v) in dead.items()} == {
        po: (bad[v], v) for po, v in want.items() if type(v) is bytes}
    reasons = {t: m for t, m, _ in dead.values()}
    assert "first byte is 0x01" in reasons["bad_magic_byte"], reasons
    assert f"has no schema id {unknown_id}" in reasons["unknown_schema"], reasons
    assert stored_offsets(name) == log_ends(topic)
    return dead, reasons
