"""Staging table names: bounded, distinct per pipeline and run, found by the cleanup."""

import re

from pipeline.store.run import staging_pattern, staging_table

LONGEST = "p" * 48  # config.IDENTIFIER allows 48 characters
MAX_RUN_ID = 2**63 - 1  # pipeline_runs.run_id is a bigint


def test_every_allowed_pipeline_name_and_run_id_fits_postgres_63_bytes():
    assert len(staging_table(LONGEST, MAX_RUN_ID).encode()) <= 63
    assert len(staging_table("a", 1).encode()) <= 63


def test_pipelines_sharing_a_long_prefix_never_share_a_staging_table():
    a, b = "orders_from_the_eu_region_primary", "orders_from_the_eu_region_replica"
    assert staging_table(a, 7) != staging_table(b, 7)
    assert staging_table(a, 7) != staging_table(a, 8)


def test_the_cleanup_pattern_finds_this_pipelines_tables_and_no_other():
    a, b = LONGEST, LONGEST[:-1] + "q"
    pattern = re.compile(staging_pattern(a))
    assert pattern.search(staging_table(a, MAX_RUN_ID))
    assert pattern.search(f"_stage_{a}_r12_blobs")  # named before names were bounded
    assert not pattern.search(staging_table(b, 1))
    assert not pattern.search(staging_table("pp", 1))
    assert not pattern.search(f"_stage_{a}x_r12_blobs")
