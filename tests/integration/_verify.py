"""Helpers for the tests of 'pipeline verify' (test_verify, test_verify_ledger,
test_verify_state): a pipeline ingested by two runs, the command through pipeline.cli.main,
and a table's owner tampering with what the pipeline wrote."""

from __future__ import annotations

import psycopg

from pipeline.cli import main as cli_main
from pipeline.driver.job import run_ingest
from tests.helpers import (
    TEST_DB_URL,
    create_topic,
    init_db,
    make_settings,
    order,
    produce,
    toml_config,
    unique,
)


def ingested_twice(tmp_path_factory, prefix: str, bad_key: bytes | None = b"k"):
    """Two partitions, good records and dead letters (three bad records keyed
    ``bad_key`` in partition 1), ingested by two runs: (settings, topic, config path,
    first run id, second run id)."""
    topic = create_topic(unique(prefix), 2)
    produce(topic, [(b"k", order(i)) for i in range(20)], partition=0)
    produce(topic, [(b"k", order(i)) for i in range(5)] + [(bad_key, b"{bad")] * 3,
            partition=1)
    s = init_db(make_settings(unique(prefix), [topic]))
    first = run_ingest(s).run_id
    produce(topic, [(b"k", order(i)) for i in range(20, 30)], partition=0)
    second = run_ingest(s).run_id
    config = tmp_path_factory.mktemp(prefix) / f"{prefix}.toml"
    config.write_text(toml_config(s.name, [topic], db_url=s.database_url))
    return s, topic, config, first, second


def verify(config, *args: str, capsys) -> tuple[int, str, str]:
    """pipeline verify --config ``config`` ``args``: (exit code, stdout, stderr)."""
    code = cli_main(["verify", "--config", str(config), *args])
    out, err = capsys.readouterr()
    return code, out, err


def execute(statement: str, params=None) -> None:
    """A statement that returns no rows, as the tables' owner (a person tampering)."""
    with psycopg.connect(TEST_DB_URL, autocommit=True) as conn:
        conn.execute(statement, params)
