"""PIPELINE__<TABLE>__<KEY> overrides (pipeline/settings/env.py) and the old generic names."""

import pytest

from pipeline.config import parse_settings
from pipeline.errors import ConfigError
from pipeline.settings import SECTIONS, load
from pipeline.settings import env as env_overrides
from pipeline.settings.env import Override, apply, overrides


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


@pytest.fixture(autouse=True)
def _fresh_warnings():
    load._WARNED.clear()  # each test sees its own warnings


def test_variables_become_keys_of_their_tables_typed_as_toml_reads_them():
    found = overrides({"PIPELINE__KAFKA__TIMEOUT_SECONDS": "30",
                       "PIPELINE__kafka__Topics": '["a", "b"]',
                       "PIPELINE__DATABASE__LOCK_TIMEOUT_SECONDS": "2.5",
                       "PIPELINE__SPARK__CONF__SPARK.UI.ENABLED": "true",
                       "PIPELINE__SCHEMA_REGISTRY__PASSWORD": "123456",
                       "PIPELINE_LOG_FORMAT": "json", "KAFKA_PORT": "1"})
    assert sorted((o.key, o.value) for o in found) == [
        ("database.lock_timeout_seconds", 2.5), ("kafka.timeout_seconds", 30),
        ("kafka.topics", ["a", "b"]),
        ("schema_registry.password", "123456"),  # text keys stay text, digits or not
        ("spark.conf.spark.ui.enabled", "true")]


def test_overlay_sets_nested_tables_and_leaves_the_document_alone():
    original = doc()
    found = overrides({"PIPELINE__KAFKA__CONSUMER__SECURITY.PROTOCOL": "SSL",
                       "PIPELINE__SINK__TABLE": "orders"})
    out = apply(original, found)
    assert out["kafka"]["consumer"] == {"security.protocol": "SSL"}
    assert out["sink"]["table"] == "orders" and out["kafka"]["topics"] == ["t"]
    assert original == doc()


def test_typed_values_reach_the_settings():
    s = parse_settings(doc(), environ={"PIPELINE__KAFKA__TIMEOUT_SECONDS": "30",
                                       "PIPELINE__KAFKA__MAX_RECORDS_PER_RUN": "0",
                                       "PIPELINE__SINK__MAX_BAD_RECORDS": "5"})
    assert (s.kafka.timeout_seconds, s.kafka.max_records_per_run) == (30.0, 0)
    assert s.sink.max_bad_records == 5


@pytest.mark.parametrize("env, message", [
    ({"PIPELINE__KAFKA__BOOTSTRAP_SERVER": "k:1"},
     "unknown key 'kafka.bootstrap_server' in config; allowed: admin_client, "),
    ({"PIPELINE__KAFKAA__BOOTSTRAP_SERVERS": "k:1"}, "unknown key 'config.kafkaa'"),
    ({"PIPELINE__KAFKA__TIMEOUT_SECONDS": "soon"}, "'kafka.timeout_seconds' must be a number"),
    ({"PIPELINE__KAFKA__TIMEOUT_SECONDS": "0"}, "'kafka.timeout_seconds' must be > 0"),
    ({"PIPELINE__DATABASE__URL": "mysql://x"}, "'database.url' must be a postgresql:// URL"),
])
def test_a_bad_value_from_the_environment_is_one_line_naming_the_variable(env, message):
    with pytest.raises(ConfigError) as e:
        parse_settings(doc(), environ=env)
    variable = next(iter(env))
    assert message in e.value.message
    assert e.value.message.endswith(f"(set by environment variable {variable})")
    assert "\n" not in e.value.message


def test_an_error_about_a_key_the_environment_did_not_set_blames_no_variable():
    with pytest.raises(ConfigError) as e:
        parse_settings(doc(kafka={"timeout_seconds": 0}),
                       environ={"PIPELINE__KAFKA__TIMEOUT": "1", "PIPELINE__SINK__TABLE": "x"})
    assert "unknown key 'kafka.timeout'" in e.value.message  # the overlay applies first
    with pytest.raises(ConfigError) as e:
        parse_settings(doc(kafka={"timeout_seconds": 0}), environ={"PIPELINE__SINK__TABLE": "x"})
    assert "environment" not in e.value.message


@pytest.mark.parametrize("variable, message", [
    ("PIPELINE__KAFKA", "write PIPELINE__<TABLE>__<KEY>"),
    ("PIPELINE__KAFKA____TOPICS", "write PIPELINE__<TABLE>__<KEY>"),
    ("PIPELINE__KAFKA__TOPICS__X", "'kafka.topics' is not a table"),
])
def test_a_malformed_variable_name_is_a_config_error(variable, message):
    with pytest.raises(ConfigError) as e:
        parse_settings(doc(), environ={variable: "1"})
    assert message in e.value.message and variable in e.value.message


def test_a_newline_cannot_smuggle_in_another_key():
    found = overrides({"PIPELINE__KAFKA__TIMEOUT_SECONDS": "30\nmax_records_per_run = 0"})
    assert found[0].value == "30\nmax_records_per_run = 0"  # text: rejected as not a number


def test_every_number_list_and_table_key_is_read_as_toml_from_the_environment():
    # A key the models type as a number/list/table that TYPED lacks would fail only from the
    # environment, "must be ..., got str '7'": set each key the models know to 7.
    for section, keys in SECTIONS.items():
        for key in keys:
            env = {f"PIPELINE__{section.upper()}__{key.upper()}": "7"}
            try:
                parse_settings(doc(), environ=env)
            except ConfigError as e:
                assert "got str" not in e.message, e.message


def test_kafka_bootstrap_servers_is_not_read_and_says_so_once(capsys):
    env = {"KAFKA_BOOTSTRAP_SERVERS": "elsewhere:9092"}
    assert parse_settings(doc(), "conf/x.toml", env).kafka.bootstrap_servers == "h:9092"
    parse_settings(doc(), "conf/x.toml", env)
    err = capsys.readouterr().err
    assert err == ("warning: KAFKA_BOOTSTRAP_SERVERS=elsewhere:9092 is not read (it overrode "
                   "every pipeline); using kafka.bootstrap_servers = 'h:9092' from conf/x.toml;"
                   " to override it, set PIPELINE__KAFKA__BOOTSTRAP_SERVERS\n")


@pytest.mark.parametrize("env", [
    {"KAFKA_BOOTSTRAP_SERVERS": "h:9092"},  # changes nothing
    {"KAFKA_BOOTSTRAP_SERVERS": "elsewhere:9092", "PIPELINE__KAFKA__BOOTSTRAP_SERVERS": "k:1"},
    {"PIPELINE_DATABASE_URL": "postgresql://u:pw@h/db"},
])
def test_an_old_name_that_changes_nothing_is_not_mentioned(env, capsys):
    parse_settings(doc(), environ=env)
    # (a PIPELINE__ variable that replaces the file's value is logged: not a warning)
    assert "warning:" not in capsys.readouterr().err


def test_pipeline_database_url_is_still_read_with_a_deprecation_warning(capsys):
    s = parse_settings(doc(), environ={"PIPELINE_DATABASE_URL": "postgresql://o:secret@x/y"})
    assert s.database_url == "postgresql://o:secret@x/y"
    err = capsys.readouterr().err
    assert err == ("warning: PIPELINE_DATABASE_URL is deprecated (read until 0.2, which "
                   "ignores it): rename it to PIPELINE__DATABASE__URL\n")


def test_the_new_database_variable_wins_over_the_old_one(capsys):
    s = parse_settings(doc(), environ={"PIPELINE_DATABASE_URL": "postgresql://old@x/y",
                                       "PIPELINE__DATABASE__URL": "postgresql://new@x/y"})
    assert s.database_url == "postgresql://new@x/y"
    assert "PIPELINE_DATABASE_URL is ignored" in capsys.readouterr().err


def test_a_bad_old_database_url_names_the_old_variable():
    with pytest.raises(ConfigError) as e:
        parse_settings(doc(), environ={"PIPELINE_DATABASE_URL": "mysql://x"})
    assert e.value.message.endswith("(set by environment variable PIPELINE_DATABASE_URL)")


def test_override_key_is_its_dotted_path():
    assert Override("PIPELINE__A__B__C", ("a", "b", "c"), 1).key == "a.b.c"
    assert env_overrides.PREFIX == "PIPELINE__"


def test_a_variable_replacing_the_files_value_is_logged_by_key_and_name_never_value(caplog):
    import logging

    env = {"PIPELINE__KAFKA__BOOTSTRAP_SERVERS": "plain:9092",
           "PIPELINE__DATABASE__URL": "postgresql://owner:hunter2@h/db",
           "PIPELINE__KAFKA__TIMEOUT_SECONDS": "30"}  # the file holds no timeout: not logged
    with caplog.at_level(logging.INFO, logger="pipeline"):
        parse_settings(doc(), "conf/secure.toml", env)
    said = [r.getMessage() for r in caplog.records if getattr(r, "event", "") ==
            "config.override"]
    assert said == [
        "config: database.url is set by the environment (PIPELINE__DATABASE__URL), not by "
        "conf/secure.toml",
        "config: kafka.bootstrap_servers is set by the environment "
        "(PIPELINE__KAFKA__BOOTSTRAP_SERVERS), not by conf/secure.toml"]
    assert "hunter2" not in caplog.text and "plain:9092" not in caplog.text


def test_bootstrap_servers_read_a_variable_as_the_client_settings_do():
    d = doc()
    d["kafka"]["bootstrap_servers"] = "${SECURE_LISTENER}"
    s = parse_settings(d, environ={"SECURE_LISTENER": "127.0.0.1:9094"})
    assert s.kafka.bootstrap_servers == "127.0.0.1:9094"
