"""[sink] evolve = "add_columns": a column added to [sink.columns] between runs is added to
the results table in the publishing transaction, with the rows that fill it, or not at all.

evolve off, the same drift is the exit-2 error before reading (here, and with its fix in
test_bad_input.py::test_a_results_table_that_drifted_from_the_config_is_exit_2_before_reading).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess

import psycopg
import pytest

from pipeline.driver.job import run_ingest
from pipeline.errors import ConfigError
from tests.helpers import (
    BOOTSTRAP,
    JSON_COLUMNS,
    ROOT,
    TEST_DB_URL,
    create_topic,
    init_db,
    job_db_url,
    make_settings,
    produce,
    produce_orders,
    query,
    toml_config,
    unique,
)
from tests.integration._reliability import finish, start_cli, stored, wait_for

OWNERS = "pipeline_evolve_test"  # the group role owning evolving tables (cluster-wide)
WITH_CHANNEL = {**JSON_COLUMNS, "channel": "string"}


def with_channel(i: int) -> tuple[bytes, bytes]:
    """An order of the new producer: it has a channel."""
    from pipeline.sample import order

    return (f"order-{i}".encode(),
            json.dumps({**json.loads(order(i)), "channel": f"web{i % 3}"}).encode())


def grant_evolve(table: str) -> None:
    """As the owner: sql/grants/evolve.sql, the grant docs/operations.md names."""
    subprocess.run(["psql", TEST_DB_URL, "-X", "-q", "-v", "ON_ERROR_STOP=1", "-v",
                    "role=pipeline", "-v", "schema=public", "-v", f"results={table}", "-v",
                    f"owners={OWNERS}", "-f", str(ROOT / "sql" / "grants" / "evolve.sql")],
                   check=True, capture_output=True)


def columns_of(table: str) -> dict[str, tuple[str, str]]:
    return {n: (t, nullable) for n, t, nullable in query(
        "SELECT column_name, data_type, is_nullable FROM information_schema.columns "
        "WHERE table_schema = 'public' AND table_name = %s", (table,))}


def pipeline_v1(prefix: str, sink: dict | None = None, grant: bool = True):
    """A pipeline that ran once with the first columns (50 orders without a channel), and
    its config with the channel declared and evolve on."""
    name = unique(prefix)
    topic = create_topic(name, 2)
    produce_orders(topic, range(50))
    v1 = init_db(make_settings(name, [topic], sink=sink))
    if grant:
        grant_evolve(name)
    assert run_ingest(v1).rows_written == 50
    v2 = make_settings(name, [topic], db_url=job_db_url(), sink={
        **(sink or {}), "columns": {**(sink or {}).get("columns", JSON_COLUMNS),
                                    "channel": "string"}, "evolve": "add_columns"})
    return v1, v2, topic


def channels(table: str) -> dict[int, str | None]:
    return dict(query(f"SELECT order_id, channel FROM {table}"))


def order_ids(table: str) -> list[tuple]:
    return query(f"SELECT order_id FROM {table}")


def test_a_column_added_to_the_config_is_added_with_the_rows_that_fill_it(spark):
    v1, v2, topic = pipeline_v1("evolve")
    produce(topic, [with_channel(i) for i in range(50, 80)])

    result = run_ingest(v2)

    assert (result.status, result.rows_written) == ("succeeded", 30)
    assert columns_of(v2.sink.table)["channel"] == ("text", "YES")
    assert channels(v2.sink.table) == {**{i: None for i in range(50)},
                                       **{i: f"web{i % 3}" for i in range(50, 80)}}
    [(details,)] = query("SELECT details FROM pipeline_runs WHERE run_id = %s",
                         (result.run_id,))
    assert details["columns_added"] == ["channel"]
    # From now on the table matches: the next run adds nothing and copies directly.
    produce(topic, [with_channel(i) for i in range(80, 90)])
    again = run_ingest(v2)
    assert again.rows_written == 10 and "columns_added" not in (query(
        "SELECT details FROM pipeline_runs WHERE run_id = %s", (again.run_id,))[0][0] or {})
    assert channels(v2.sink.table)[85] == "web1"


def test_evolve_off_the_same_drift_is_exit_2_before_reading(spark):
    v1, v2, topic = pipeline_v1("evolve_off", grant=False)
    from dataclasses import replace
    off = replace(v2, sink=replace(v2.sink, evolve="off"))

    with pytest.raises(ConfigError) as e:
        run_ingest(off)

    assert e.value.exit_code == 2
    assert "column channel is missing" in e.value.message
    assert "channel" not in columns_of(v2.sink.table)


def test_a_job_role_that_may_not_alter_the_table_is_exit_2_naming_the_grant(spark):
    v1, v2, topic = pipeline_v1("evolve_owner", grant=False)
    produce(topic, [with_channel(i) for i in range(50, 60)])

    with pytest.raises(ConfigError) as e:
        run_ingest(v2)

    assert e.value.exit_code == 2
    assert "must be owner of table" in e.value.message
    assert "sql/grants/evolve.sql" in e.value.message
    assert "channel" not in columns_of(v2.sink.table)
    assert len(order_ids(v2.sink.table)) == 50  # nothing of the run committed


def test_a_new_not_null_column_on_a_table_with_rows_is_refused_before_reading(spark):
    v1, v2, topic = pipeline_v1("evolve_nn")
    from dataclasses import replace

    from pipeline.config import Column
    strict = replace(v2, sink=replace(v2.sink, columns=tuple(
        Column(c.name, c.type, True) if c.name == "channel" else c for c in v2.sink.columns)))

    with pytest.raises(ConfigError) as e:
        run_ingest(strict)

    assert e.value.exit_code == 2
    assert "cannot add column channel as NOT NULL" in e.value.message
    assert "ADD COLUMN \"channel\" text NOT NULL DEFAULT" in e.value.message
    assert "channel" not in columns_of(v2.sink.table)


def test_sigkill_before_commit_leaves_the_column_but_none_of_the_rows(spark, tmp_path):
    """The column is added in a short transaction of its own before the read (readers never
    queue behind a publishing transaction); the rows commit with the offsets or not at all,
    and the rerun fills the column."""
    v1, v2, topic = pipeline_v1("evolve_kill")
    produce(topic, [with_channel(i) for i in range(50, 80)])
    before = stored(v1.name, TEST_DB_URL)
    config = tmp_path / "v2.toml"
    config.write_text(toml_config(v2.name, [topic], extra_sink='evolve = "add_columns"')
                      .replace("[spark]", 'channel = "string"\n[spark]'))

    proc = start_cli("run", "--config", str(config),
                     env={"PIPELINE__KAFKA__BOOTSTRAP_SERVERS": BOOTSTRAP,
                          "PIPELINE__DATABASE__URL": job_db_url(),
                          "PIPELINE_FAULT": "before_commit:kill"})
    code, _, err = finish(proc)

    assert code == -signal.SIGKILL, err[-3000:]
    assert columns_of(v2.sink.table)["channel"] == ("text", "YES")
    assert channels(v2.sink.table) == {i: None for i in range(50)}  # none of the run's rows
    assert stored(v1.name, TEST_DB_URL) == before
    # The rerun writes the rows, with their channel.
    result = run_ingest(v2)
    assert (result.status, result.rows_written) == ("succeeded", 30)
    assert channels(v2.sink.table) == {**{i: None for i in range(50)},
                                       **{i: f"web{i % 3}" for i in range(50, 80)}}


def test_upsert_evolves_through_its_merge(spark):
    upsert = {"mode": "upsert", "key": ["order_id"], "columns": JSON_COLUMNS}
    v1, v2, topic = pipeline_v1("evolve_upsert", sink=upsert)
    # A newer record of order 7 and 8 new orders, now with a channel.
    produce(topic, [with_channel(i) for i in (7, *range(50, 58))])

    result = run_ingest(v2)

    assert result.status == "succeeded" and result.rows_written == 9
    got = channels(v2.sink.table)
    assert len(got) == 58
    assert got[7] == "web1" and got[6] is None and got[57] == "web0"


def test_readers_never_queue_long_behind_an_evolving_run(spark, tmp_path):
    """A long reader holds the table (ACCESS SHARE, its transaction open) while a run that
    adds a column starts: the run's ALTER TABLE waits for it only briefly at a time, so a
    new SELECT is not stuck behind the queued ALTER; once the reader is done the run adds
    the column and its rows."""
    v1, v2, topic = pipeline_v1("evolve_reader")
    produce(topic, [with_channel(i) for i in range(50, 80)])
    config = tmp_path / "v2.toml"
    config.write_text(toml_config(v2.name, [topic], extra_sink='evolve = "add_columns"')
                      .replace("[spark]", 'channel = "string"\n[spark]'))
    table = v2.sink.table
    reader = psycopg.connect(TEST_DB_URL, application_name="long-reader")
    proc = None
    try:
        reader.execute(f"SELECT count(*) FROM {table}").fetchone()  # transaction stays open
        proc = start_cli("run", "--config", str(config))
        wait_for(lambda: query(
            "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE "
            "%s", (f'ALTER TABLE "public"."{table}"%',)), 180, "the run's ALTER TABLE", proc)
        # A new reader, while the ALTER is queued: served within a few seconds (a generous
        # bound; behind an ALTER that waits for the long reader it would be stuck as long).
        with psycopg.connect(TEST_DB_URL, autocommit=True) as probe:
            probe.execute("SET statement_timeout = '10s'")
            assert probe.execute(f"SELECT count(*) FROM {table}").fetchone() == (50,)
    except BaseException:
        if proc is not None:
            os.killpg(proc.pid, signal.SIGKILL)
        raise
    finally:
        reader.close()  # the long reader ends: its transaction rolls back
    code, _, err = finish(proc)

    assert code == 0, err[-3000:]
    assert "application 'long-reader'" in err, err[-3000:]  # who held the table
    assert channels(table) == {**{i: None for i in range(50)},
                               **{i: f"web{i % 3}" for i in range(50, 80)}}
