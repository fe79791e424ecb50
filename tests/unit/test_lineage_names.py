"""OpenLineage's names for what a run reads and writes (airflow_dags/pipeline_airflow/
lineage.py, pure: it imports openlineage only when the provider asks for facets), and the
offsets facet's ranges from the job's JSON summary. The real events are checked in
tests/airflow/test_lineage.py."""

from __future__ import annotations

import importlib.util
import re
import tomllib

from tests.helpers import ROOT


def load_lineage():
    spec = importlib.util.spec_from_file_location(
        "lineage", ROOT / "airflow_dags" / "pipeline_airflow" / "lineage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


lineage = load_lineage()

DOC = {"kafka": {"bootstrap_servers": "Broker-1.example:9092,broker-2.example:9092",
                 "topics": ["orders", "refunds"]},
       "database": {"url": "postgresql://pipeline:${PG_PASSWORD}@db.example:6432/sales"
                           "?sslmode=verify-full", "schema": "ingest"},
       "sink": {"table": "orders_raw"}}


def test_each_topic_is_a_dataset_of_the_first_bootstrap_server():
    names = lineage.lineage_datasets(DOC, ["run", "--config", "x.toml"], {})
    assert names["inputs"] == [("kafka://broker-1.example:9092", "orders"),
                               ("kafka://broker-1.example:9092", "refunds")]


def test_the_table_is_database_schema_table_on_host_and_port():
    names = lineage.lineage_datasets(DOC, [], {"PG_PASSWORD": "s3cret"})
    assert names["outputs"] == [("postgres://db.example:6432", "sales.ingest.orders_raw")]


def test_the_jobs_environment_wins_over_the_config_as_in_the_job():
    names = lineage.lineage_datasets(
        DOC, [], {}, servers="SASL_SSL://kafka.prod:9094",
        url="postgresql://u:p@pg.prod/warehouse")
    assert names["inputs"][0] == ("kafka://kafka.prod:9094", "orders")
    # No port in the URL: Postgres' own, as the naming spec wants one.
    assert names["outputs"] == [("postgres://pg.prod:5432", "warehouse.ingest.orders_raw")]


def test_a_backfill_reads_only_its_topic():
    names = lineage.lineage_datasets(DOC, ["backfill", "--topic", "refunds"], {})
    assert [name for _, name in names["inputs"]] == ["refunds"]


def test_no_secret_reaches_a_dataset_name():
    names = lineage.lineage_datasets(DOC, [], {"PG_PASSWORD": "s3cret"})
    assert "s3cret" not in repr(names) and "pipeline" not in repr(names["outputs"])


def test_published_ranges_count_records_and_rows_per_partition():
    summary = {"plan": [{"topic": "orders", "partition": 0, "from": 5, "until": 9},
                        {"topic": "orders", "partition": 1, "from": 3, "until": 3}],
               "per_partition": {"orders[0]": {"rows": 2, "dead": 1, "deletes": 1}}}
    assert lineage.published_ranges(summary) == [
        {"topic": "orders", "partition": 0, "from": 5, "until": 9, "records": 4, "rows": 2,
         "deadLetters": 1},
        {"topic": "orders", "partition": 1, "from": 3, "until": 3, "records": 0, "rows": 0,
         "deadLetters": 0}]


def test_a_failed_job_published_no_ranges():
    assert lineage.published_ranges({}) == []


def test_the_airflow_extra_starts_at_the_versions_the_airflow_venv_pins():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]["airflow"]
    pins = dict(re.findall(r"([a-z-]+)==([0-9.]+)",
                           re.search(r"AIRFLOW_PINS=\(([^)]*)\)",
                                     (ROOT / "scripts" / "stack").read_text()).group(1)))
    floors = dict(re.match(r"([a-z-]+)>=([0-9.]+)", req).groups() for req in extra)
    assert floors == {name: pins[name] for name in floors}
    assert set(floors) == {"apache-airflow", "apache-airflow-providers-openlineage"}


def test_each_topic_names_the_table_its_route_resolves():
    doc = {**DOC, "kafka": {**DOC["kafka"], "topics": ["shop.public.orders", "shop.public.lines",
                                                       "shop.public.carts"]},
           "sink": {"table": "{schema}_{table}",
                    "topics": {"shop.public.lines": {"table": "order_lines"},
                               "shop.public.carts": {"table": "orders_raw"}}}}
    names = lineage.lineage_datasets(doc, [], {"PG_PASSWORD": "s3cret"})
    assert [name for _, name in names["outputs"]] == [
        "sales.ingest.public_orders", "sales.ingest.order_lines", "sales.ingest.orders_raw"]
    pattern = {**doc, "kafka": {"bootstrap_servers": "b:9092", "topic_pattern": "shop\\..*"}}
    assert lineage.lineage_datasets(pattern, [], {})["outputs"] == []  # found by each run
