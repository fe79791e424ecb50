"""The Run (pipeline/store/run.py): what derives from a run's id, kind and pipeline."""

import pytest

from pipeline.store.run import FAMILIES, Kind, Run, kinds_of, lock_key, staging_table


def test_a_backfill_or_reprocess_has_its_own_lock_an_offsets_change_or_replay_holds_both():
    assert [k.family for k in Kind] == ["ingest", "backfill", "backfill", "ingest", "ingest"]
    assert kinds_of("ingest") == (Kind.INGEST, Kind.REPLAY, Kind.OFFSETS)
    assert kinds_of("backfill") == (Kind.BACKFILL, Kind.REPROCESS, Kind.REPLAY, Kind.OFFSETS)
    assert set(FAMILIES) == {"ingest", "backfill", "offsets"}
    assert lock_key("p", "ingest") == "p" and lock_key("p", "backfill") == "p:backfill"


def test_only_a_reprocess_replaces_what_its_ranges_held():
    assert [k for k in Kind if k.overwrite] == [Kind.REPROCESS]


def test_a_kind_is_its_pipeline_runs_name():
    assert Kind("reprocess") is Kind.REPROCESS and f"{Kind.BACKFILL}" == "backfill"
    with pytest.raises(ValueError):
        Kind("merge")


def test_a_run_owns_its_lock_key_and_staging_table():
    run = Run(12, Kind.REPROCESS, "orders", "sch")
    assert (run.family, run.lock_key, run.overwrite) == ("backfill", "orders:backfill", True)
    assert run.staging_name == staging_table("orders", 12)
    assert run.staging.as_string(None) == f'"sch"."{run.staging_name}"'
    ingest = Run(12, Kind.INGEST, "orders", "sch")
    assert (ingest.lock_key, ingest.overwrite) == ("orders", False)


def test_the_staging_copy_names_every_staging_column_with_its_type():
    statement, types = Run(3, Kind.INGEST, "p", "sch").staging_copy()
    assert statement == (
        f'COPY "sch"."{staging_table("p", 3)}" ("part", "attempt", "task", "seq", "topic", '
        '"partition", "kind", "n", "min_offset", "max_offset", "blob") FROM STDIN '
        "(FORMAT BINARY)")
    assert types == ["integer", "integer", "bigint", "integer", "text", "integer", "text",
                     "integer", "bigint", "bigint", "bytea"]
