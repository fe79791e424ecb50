"""A primary-key change of a row whose TOASTed column it leaves unchanged (the shop's
rekey_customer: ``UPDATE customers SET id = new WHERE id = old``): Debezium writes a delete
of the old key, its tombstone, and a create of the new key (header ``__debezium.oldkey``)
whose ``profile`` is the placeholder ``__debezium_unavailable_value``. The replica's new row
must hold the profile the old key's row had (docs/cdc.md), not NULL, and ``pipeline verify``
recomputes the same."""

from __future__ import annotations

import psycopg
import pytest

from pipeline.sample_shop_compare import compare
from pipeline.sample_shop_replica import config
from tests.cdc.conftest import SOURCE_URL, ShopRun
from tests.helpers import BOOTSTRAP, TEST_DB_URL, cli_here, unique

pytestmark = pytest.mark.integration

PLACEHOLDER = "__debezium_unavailable_value"


def test_a_primary_key_change_keeps_the_old_keys_toasted_profile(shop_run: ShopRun,
                                                                 tmp_path):
    rekeyed = [e for e in shop_run.json.table("customers")
               if "__debezium.oldkey" in e.headers
               and e.json()["payload"]["after"]["profile"] == PLACEHOLDER]
    assert rekeyed, "the workload's primary-key change is not in the stream"
    schema, name = unique("rekey"), unique("rekey")
    with psycopg.connect(TEST_DB_URL, autocommit=True) as conn:
        conn.execute(f'CREATE SCHEMA "{schema}"')
    path = tmp_path / "customers.toml"
    path.write_text(config(name, BOOTSTRAP, TEST_DB_URL, schema, tables=("customers",)))
    for command in ("init-db", "run"):
        r = cli_here(command, "--config", str(path))
        assert r.returncode == 0, r.stderr[-3000:]
    (diff,) = compare(SOURCE_URL, TEST_DB_URL, schema, tables=["customers"])
    assert diff.equal, diff.first
    # verify recomputes the state from Kafka by the merge's rule: the profile too.
    r = cli_here("verify", "--config", str(path))
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
