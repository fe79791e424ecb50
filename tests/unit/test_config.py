import re
import tomllib
from pathlib import Path

import pytest

from pipeline.config import load_settings, mask, parse_settings, redact_url
from pipeline.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def doc(**changes):
    d = {
        "pipeline": {"name": "p1"},
        "kafka": {"bootstrap_servers": "h:9092", "topics": ["t"]},
        "database": {"url": "postgresql://u:pw@h/db"},
        "sink": {"format": "raw", "table": "events"},
    }
    for section, values in changes.items():
        d.setdefault(section, {}).update(values)
    return d


def test_shipped_config_is_valid():
    s = load_settings("conf/local.toml", environ={})
    assert s.name == "demo" and s.sink.format == "json" and s.kafka.topics == ("demo_orders",)
    assert [c.name for c in s.sink.columns][:2] == ["order_id", "customer"]


def test_example_configs_are_valid():
    upsert = load_settings("conf/examples/upsert.toml", environ={}).sink
    assert (upsert.mode, upsert.key, upsert.deletes) == ("upsert", ("order_id",), True)
    totals = load_settings("conf/examples/aggregate.toml", environ={}).sink
    assert (totals.mode, totals.key) == ("aggregate", ("customer", "day"))
    assert {a.function for a in totals.aggregates} == {"sum", "count", "min", "max"}
    avro = load_settings("conf/examples/avro.toml", environ={})
    assert avro.sink.format == "avro" and avro.schema_registry.schemas_dir.endswith(
        "conf/examples/avro-schemas")
    enriched = load_settings("conf/examples/transform.toml", environ={}).sink
    assert enriched.transform == "order_enrichment:enrich" and enriched.mode == "append"
    shop = load_settings("conf/examples/tables.toml", environ={})
    assert [(t.table, t.sink.key) for t in shop.routes.tables(shop.kafka.topics)] == [
        ("order_lines", ("order_id", "line_no")), ("orders", ("id",))]
    cdc = load_settings("conf/examples/cdc.toml", environ={})
    assert cdc.sink.transactions == "shop_json.transaction"
    assert [t.table for t in cdc.routes.tables(cdc.kafka.topics)] == [
        "accounts", "carts", "customers", "order_lines", "orders"]


def test_the_cdc_example_is_what_the_bench_and_the_chain_tests_replicate_with():
    """conf/examples/cdc.toml and pipeline/sample_shop_replica.config (the bench's and
    tests/cdc's) say the same of every table."""
    from pipeline.sample_shop_replica import config

    example = load_settings("conf/examples/cdc.toml", environ={})
    made = parse_settings(tomllib.loads(config(
        "shop_replica", "127.0.0.1:9092", "postgresql://postgres@127.0.0.1:5433/pipeline",
        "replica", transactions=True)), source="conf/examples/cdc.toml", environ={})
    assert example == made


@pytest.mark.parametrize("changes, message", [
    ({"kafka": {"topicz": ["t"]}}, "unknown key 'kafka.topicz'"),
    ({"kafka": {"max_records_per_partition": "10"}}, "'kafka.max_records_per_partition' must be "
                                                     "an integer"),
    ({"kafka": {"max_records_per_run": -1}}, "'kafka.max_records_per_run' must be >= 0"),
    ({"kafka": {"on_data_loss": "ignore"}}, "must be one of fail, skip"),
    ({"sink": {"table": "events; drop table x"}}, "not a safe SQL identifier"),
    ({"database": {"schema": "Public"}}, "not a safe SQL identifier"),
    ({"pipeline": {"name": "1abc"}}, "not a safe SQL identifier"),
    ({"database": {"url": "mysql://x"}}, "postgresql:// URL"),
    ({"database": {"lock_timeout_seconds": -1}}, "'database.lock_timeout_seconds' must be >= 0"),
    ({"database": {"statement_timeout_seconds": "1m"}}, "must be a number"),
    ({"sink": {"format": "json"}}, "needs at least one column"),
    ({"sink": {"format": "json", "columns": {"a": "varchar"}}}, "'sink.columns.a'"),
    ({"sink": {"format": "json", "columns": {"offset": "long"}}}, "reserved"),
    ({"kafka": {"consumer": {"group.id": "x"}}}, "managed by the pipeline"),
    ({"sink": {"transform": "no_colon"}}, "module:function"),
    ({"kafka": {"timeout_seconds": True}}, "got a boolean"),
    # only the file's spelling of a key: not the model's field name behind it
    ({"database": {"schema_": "x"}}, "unknown key 'database.schema_'"),
])
def test_bad_config_is_one_line_error_naming_the_key(changes, message):
    with pytest.raises(ConfigError) as e:
        parse_settings(doc(**changes), environ={})
    assert message in e.value.message
    assert "\n" not in e.value.message


def test_runs_are_bounded_unless_a_cap_is_set_to_zero():
    k = parse_settings(doc(), environ={}).kafka
    assert (k.max_records_per_partition, k.max_records_per_run) == (5_000_000, 20_000_000)
    k = parse_settings(doc(kafka={"max_records_per_partition": 0, "max_records_per_run": 0}),
                       environ={}).kafka
    assert (k.max_records_per_partition, k.max_records_per_run) == (0, 0)


def test_namespaced_environment_overrides_bootstrap_and_database_url():
    s = parse_settings(doc(), environ={"PIPELINE__KAFKA__BOOTSTRAP_SERVERS": "k1:1,k2:2",
                                       "PIPELINE__DATABASE__URL": "postgresql://o@x/y"})
    assert s.kafka.bootstrap_servers == "k1:1,k2:2"
    assert s.database_url == "postgresql://o@x/y"


def test_consumer_settings_pass_through_with_env_secrets():
    s = parse_settings(doc(kafka={"consumer": {"security.protocol": "SASL_SSL",
                                               "sasl.password": "${SASL_PW}"}}),
                       environ={"SASL_PW": "s3cret"})
    assert s.kafka.client_config()["sasl.password"] == "s3cret"
    assert s.kafka.client_config()["security.protocol"] == "SASL_SSL"
    assert "s3cret" not in str(s.redacted()) and "pw@" not in str(s.redacted())


def test_percent_encoded_password_is_masked_in_both_forms():
    s = parse_settings(doc(database={"url": "postgresql://u:p%40ss@h/db"}), environ={})
    assert redact_url(s.database_url) == "postgresql://u:***@h/db"
    assert mask(f"at {s.database_url} (refused)") == "at postgresql://u:***@h/db (refused)"


def test_missing_env_reference_is_an_error():
    with pytest.raises(ConfigError, match=r"\$\{NOPE\}"):
        parse_settings(doc(kafka={"consumer": {"sasl.password": "${NOPE}"}}), environ={})


def test_redact_url_hides_only_the_password():
    assert redact_url("postgresql://u:pw@h:5/db") == "postgresql://u:***@h:5/db"
    assert redact_url("postgresql://u@h/db") == "postgresql://u@h/db"


def test_client_settings_go_to_confluent_kafka():
    s = parse_settings(doc(kafka={
        "consumer": {"security.protocol": "SASL_SSL"},
        "admin_client": {"sasl.password": "${PW}"}}), environ={"PW": "hunter2"})
    assert s.kafka.client_config() == {"security.protocol": "SASL_SSL",
                                       "sasl.password": "hunter2", "bootstrap.servers": "h:9092"}
    assert "hunter2" not in str(s.redacted())


def test_a_config_that_still_sets_spark_consumer_is_one_error_line_naming_its_replacement(
        tmp_path, capsys):
    from pipeline.cli import main

    config = tmp_path / "p.toml"
    config.write_text((ROOT / "conf" / "local.toml").read_text() + (
        '[kafka.spark_consumer]\n"sasl.jaas.config" = "x required password=\\"s3cr3t\\";"\n'))
    code = main(["run", "--config", str(config)])
    out, err = capsys.readouterr()
    assert code == 2 and out == ""
    assert len(err.splitlines()) == 1 and err.startswith("error: "), err
    assert "[kafka.spark_consumer] is no longer read" in err
    assert "[kafka.consumer] replaced it" in err and "s3cr3t" not in err


def test_settings_confluent_kafka_rejects_are_a_config_error():
    from pipeline.driver.kafka_meta import KafkaMeta

    s = parse_settings(doc(kafka={"consumer": {"no.such.setting": "1"}}), environ={})
    with pytest.raises(ConfigError, match="no.such.setting"):
        KafkaMeta(s.kafka)


def test_publish_timeouts_default_to_a_minute_for_locks_and_none_for_statements():
    s = parse_settings(doc(), "x")
    assert (s.lock_timeout_seconds, s.statement_timeout_seconds) == (60.0, 0.0)
    s = parse_settings(doc(database={"lock_timeout_seconds": 5, "statement_timeout_seconds": 1.5}),
                       "x")
    assert (s.lock_timeout_seconds, s.statement_timeout_seconds) == (5.0, 1.5)


# A password that is a common word: masking by place keeps the words around it.
def test_a_common_word_password_is_masked_where_it_stands_and_nowhere_else():
    url = "postgresql://pipeline:error@127.0.0.1:5433/pipeline?sslmode=verify-full"
    message = (f"error: Postgres at {url} refused role 'pipeline': FATAL: password "
               'authentication failed for user "pipeline"; fix the password')
    assert mask(message) == (
        "error: Postgres at postgresql://pipeline:***@127.0.0.1:5433/pipeline?sslmode="
        "verify-full refused role 'pipeline': FATAL: password authentication failed for "
        'user "pipeline"; fix the password')


def test_secret_keys_conninfo_and_jaas_passwords_are_masked():
    jaas = ('org.apache.kafka.common.security.scram.ScramLoginModule required '
            'username="pipeline" password="pipeline";')
    assert mask(f"sasl.jaas.config = {jaas}") == (
        'sasl.jaas.config = *** required username="pipeline" password="***";')
    assert mask(jaas) == jaas.replace('password="pipeline"', 'password="***"')
    assert mask("host=h user=pipeline password=pipeline dbname=pipeline") == (
        "host=h user=pipeline password=*** dbname=pipeline")
    assert mask("password='two words' sslmode=require") == "password='***' sslmode=require"
    assert mask("{'sasl.password': 'pipeline', 'sasl.username': 'pipeline'}") == (
        "{'sasl.password': '***', 'sasl.username': 'pipeline'}")
    assert mask('"ssl.truststore.password" = "pipeline"') == (
        '"ssl.truststore.password" = "***"')
    # The TOML form of a JAAS line, its quotes escaped.
    assert mask('username=\\"pipeline\\" password=\\"pipeline\\";') == (
        'username=\\"pipeline\\" password=\\"***\\";')


def test_a_url_password_with_an_at_sign_is_masked_whole():
    assert mask("postgresql://u:p@ss@h:1/db") == "postgresql://u:***@h:1/db"
    assert mask("postgresql://u@h/db and kafka://h:9092") == (
        "postgresql://u@h/db and kafka://h:9092")


def test_database_url_reads_the_password_from_the_environment():
    s = parse_settings(doc(database={"url": "postgresql://u:${DB_PW}@h/db?sslmode=verify-full"}),
                       environ={"DB_PW": "pipeline"})
    assert s.database_url == "postgresql://u:pipeline@h/db?sslmode=verify-full"
    assert redact_url(s.database_url) == "postgresql://u:***@h/db?sslmode=verify-full"


def test_an_airflow_table_is_accepted_for_the_dags_and_ignored_by_the_job():
    table = {"schedule": "*/10 * * * *", "retries": 5, "retry_delay_seconds": 30,
             "max_retry_delay_seconds": 600.0, "execution_timeout_seconds": 3600,
             "owner": "payments", "tags": ["orders", "tier-1"], "pool": "spark",
             "pool_slots": 2, "queue": "spark_workers", "spark_conn_id": "spark_yarn",
             "postgres_conn_id": "orders_db", "kafka_conn_id": "orders_kafka"}
    assert parse_settings(doc(airflow=table), environ={}) == parse_settings(doc(), environ={})


@pytest.mark.parametrize("airflow, message", [
    ({"scheduel": "@daily"}, "unknown key 'airflow.scheduel' in config; allowed: "),
    ({"retries": "3"}, "'airflow.retries' must be an integer, got str '3'"),
    ({"retries": -1}, "'airflow.retries' must be >= 0, got -1"),
    ({"retries": True}, "'airflow.retries' must be an integer, got a boolean"),
    ({"retry_delay_seconds": "1m"}, "'airflow.retry_delay_seconds' must be a number"),
    ({"execution_timeout_seconds": 0}, "'airflow.execution_timeout_seconds' must be >= 1"),
    # Airflow's timedelta overflows at 1e300: the job names the key instead.
    ({"execution_timeout_seconds": 1e300}, "'airflow.execution_timeout_seconds' must be <= "),
    ({"pool_slots": 0}, "'airflow.pool_slots' must be >= 1"),
    ({"owner": " "}, "'airflow.owner' must not be empty"),
    ({"tags": "orders"}, "'airflow.tags' must be a list"),
    ({"tags": ["orders", 1]}, "'airflow.tags' must be a list of non-empty strings"),
    ({"kafka_conn_id": 7}, "'airflow.kafka_conn_id' must be a string"),
])
def test_a_bad_airflow_table_is_one_line_error_naming_the_key(airflow, message):
    with pytest.raises(ConfigError) as e:
        parse_settings(doc(airflow=airflow), environ={})
    assert message in e.value.message
    assert "\n" not in e.value.message
    assert e.value.exit_code == 2


def test_an_airflow_table_that_is_not_a_table_is_an_error():
    d = doc()
    d["airflow"] = "daily"
    with pytest.raises(ConfigError, match=r"'airflow' must be a table \(\[airflow\]\)"):
        parse_settings(d, environ={})


def avro(tmp_path, registry=None, **sink):
    return doc(sink={"format": "avro", "columns": {"order_id": "string not null"}, **sink},
               schema_registry={"schemas_dir": str(tmp_path)} if registry is None else registry)


def test_avro_reads_schemas_from_a_folder_or_a_registry_with_env_secrets(tmp_path):
    s = parse_settings(avro(tmp_path), environ={})
    assert s.sink.format == "avro" and s.schema_registry.schemas_dir == str(tmp_path.resolve())
    s = parse_settings(avro(tmp_path, {"url": "https://r:8081", "user": "u",
                                       "password": "${SR_PW}"}), environ={"SR_PW": "s3"})
    assert (s.schema_registry.url, s.schema_registry.user, s.schema_registry.password) == (
        "https://r:8081", "u", "s3")
    assert "s3" not in repr(s) and s.redacted()["schema_registry"] == "schema registry https://r:8081"
    upsert = parse_settings(avro(tmp_path, mode="upsert", key=["order_id"]), environ={})
    assert upsert.sink.key == ("order_id",)


@pytest.mark.parametrize("registry, sink, message", [
    ({}, {}, "needs exactly one of schema_registry.url"),
    ({"url": "http://r", "schemas_dir": "."}, {}, "needs exactly one of schema_registry.url"),
    ({"url": "r:8081"}, {}, "write the registry's URL as http(s)://host:port"),
    ({"schemas_dir": "/no/such/dir"}, {}, "'schema_registry.schemas_dir' = '/no/such/dir' is "
                                          "not a folder"),
    ({"url": "http://r", "password": "p"}, {}, "needs schema_registry.user"),
    ({"url": "http://r", "port": 1}, {}, "unknown key 'schema_registry.port'"),
    (None, {"transform": "m:f", "columns": {"doc": "jsonb"}},
     "'sink.columns.doc' (jsonb) is not supported with 'sink.transform'"),
    (None, {"columns": {}}, "sink.format = 'avro' needs at least one column"),
])
def test_bad_avro_config_is_one_line_error(tmp_path, registry, sink, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as e:
        parse_settings(avro(tmp_path, registry, **sink), environ={})
    assert "\n" not in str(e.value)


def test_a_schema_registry_without_avro_is_an_error():
    with pytest.raises(ConfigError, match="only for sink.format = 'avro'"):
        parse_settings(doc(schema_registry={"url": "http://r"}), environ={})


def test_secrets_are_held_as_secrets_and_shown_nowhere():
    from pipeline.settings import ConfigFile

    d = doc(database={"url": "postgresql://u:dbsecret@h/db"},
            kafka={"consumer": {"sasl.password": "kafkasecret", "sasl.username": "u"}})
    model = ConfigFile.model_validate(d)
    for text in (repr(model), str(model), model.model_dump_json(), str(model.model_dump())):
        assert "dbsecret" not in text and "kafkasecret" not in text
    s = parse_settings(d, environ={})
    assert "dbsecret" not in repr(s) and "kafkasecret" not in repr(s)
    assert "dbsecret" not in str(s.redacted()) and "kafkasecret" not in str(s.redacted())
    assert s.database_url == "postgresql://u:dbsecret@h/db"  # the run still gets them
    assert s.kafka.client_config()["sasl.password"] == "kafkasecret"


@pytest.mark.parametrize("changes", [{"database": {"url": 12345}},
                                     {"kafka": {"bootstrap_servers": "h:1"},
                                      "schema_registry": {"url": "http://r", "user": "u",
                                                          "password": 12345},
                                      "sink": {"format": "avro", "table": "t",
                                               "columns": {"a": "long"}}}])
def test_a_secret_of_the_wrong_type_is_not_quoted_in_the_error(changes):
    with pytest.raises(ConfigError) as e:
        parse_settings(doc(**changes), environ={})
    assert "must be a string, got int" in e.value.message and "12345" not in e.value.message


def test_a_database_url_whose_port_is_not_a_number_is_a_config_error():
    with pytest.raises(ConfigError, match="'database.url' is not a valid URL"):
        parse_settings(doc(database={"url": "postgresql://u@h:notaport/db"}), environ={})


@pytest.mark.parametrize("sink, message", [
    ({"columns": {"a": "long"}},
     "[sink.columns] is only for sink.format = 'json', 'avro' or 'protobuf'"),
    ({"mode": "upsert", "key": ["a"]},
     "sink.mode = 'upsert' needs sink.format = 'json', 'avro' or 'protobuf'"),
])
def test_a_raw_sinks_errors_name_every_format_with_columns(sink, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        parse_settings(doc(sink=sink), environ={})
