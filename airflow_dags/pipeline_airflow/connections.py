"""Airflow Connections as the job's environment, never its command line: a postgres
connection becomes the job's database URL, a kafka connection (the Kafka provider's shape:
the client settings as the extra) its bootstrap servers plus one KAFKA_<KEY> variable per
client setting, for the config's ${KAFKA_...} references (pipeline/settings/env.py)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote, urlencode

from airflow.sdk.exceptions import AirflowFailException

# What the job reads instead of its config's database.url / kafka.bootstrap_servers.
ENV_DATABASE_URL = "PIPELINE__DATABASE__URL"
ENV_BOOTSTRAP = "PIPELINE__KAFKA__BOOTSTRAP_SERVERS"
# Extra keys whose values are registered with Airflow's secrets masker.
SECRET_SETTING = re.compile(r"(password|secret|token|jaas|credentials|key)", re.I)


def postgres_url(conn: Any) -> str:
    """A postgres connection as the job's database URL: host, port, login, password,
    schema (Airflow's name for the database) and the extra's libpq parameters (sslmode,
    sslrootcert, ...) as the query string."""
    if not conn.host:
        raise AirflowFailException(f"connection {conn.conn_id!r} has no host: set the "
                                   "Postgres server's host name in it - not retried")
    auth = ""
    if conn.login:
        auth = quote(conn.login, safe="")
        if conn.password:
            auth += ":" + quote(conn.password, safe="")
        auth += "@"
    port = f":{conn.port}" if conn.port else ""
    params = {k: str(v) for k, v in conn.extra_dejson.items() if v is not None}
    query = f"?{urlencode(params)}" if params else ""
    return f"postgresql://{auth}{conn.host}{port}/{conn.schema or 'postgres'}{query}"


def kafka_env_name(key: str) -> str:
    """The variable a Kafka client setting is handed over in: sasl.password ->
    KAFKA_SASL_PASSWORD, for the config's ${KAFKA_SASL_PASSWORD}."""
    return "KAFKA_" + re.sub(r"[^A-Za-z0-9]", "_", key).upper()


def kafka_env(conn: Any) -> dict[str, str]:
    """A Kafka connection as the job's environment, bootstrap.servers among its settings
    (or its host and port)."""
    settings = dict(conn.extra_dejson)
    servers = settings.pop("bootstrap.servers", None) or (
        f"{conn.host}:{conn.port}" if conn.host and conn.port else conn.host)
    if not servers:
        raise AirflowFailException(f"connection {conn.conn_id!r} has no bootstrap.servers "
                                   "in its extra: add it - not retried")
    env = {ENV_BOOTSTRAP: str(servers)}
    for key, value in settings.items():
        text = str(value).lower() if isinstance(value, bool) else str(value)
        env[kafka_env_name(key)] = text
    return env


def unused_kafka_settings(config_text: str, env: dict[str, str]) -> list[str]:
    """The connection's client settings this config neither references (${KAFKA_...}) nor
    sets itself: the job would connect without them."""
    return [name for name in env if name != ENV_BOOTSTRAP
            and "${" + name + "}" not in config_text]


def credentials_env(postgres_conn_id: str | None, kafka_conn_id: str | None,
                    config: str | None, log: Any) -> dict[str, str]:
    """The Postgres and Kafka connections, resolved now (on the worker, so that a secrets
    backend is asked only by the task that needs them), as the job's environment; each
    secret registered with Airflow's masker, so that no log line can show it."""
    from airflow.sdk import BaseHook
    from airflow.sdk.log import mask_secret

    env: dict[str, str] = {}
    if postgres_conn_id:
        conn = BaseHook.get_connection(postgres_conn_id)
        if conn.password:
            mask_secret(conn.password)
            mask_secret(quote(conn.password, safe=""))
        env[ENV_DATABASE_URL] = postgres_url(conn)
        log.info("database from connection %r (%s@%s:%s/%s)", postgres_conn_id, conn.login,
                 conn.host, conn.port or 5432, conn.schema)
    if kafka_conn_id:
        conn = BaseHook.get_connection(kafka_conn_id)
        kafka = kafka_env(conn)
        for key, value in conn.extra_dejson.items():
            if SECRET_SETTING.search(key) and value:
                mask_secret(str(value))
        env.update(kafka)
        log.info("Kafka from connection %r: bootstrap servers %s; settings in %s",
                 kafka_conn_id, kafka[ENV_BOOTSTRAP],
                 ", ".join(sorted(set(kafka) - {ENV_BOOTSTRAP})) or "none")
        text = _text(config) if config else None
        unused = unused_kafka_settings(text, kafka) if text is not None else []
        if unused:
            log.warning(
                "connection %r carries %s, which %s does not use: refer to each in the "
                "config's [kafka.consumer]/[kafka.admin_client] table as \"${NAME}\", "
                "e.g. \"sasl.password\" = \"${KAFKA_SASL_PASSWORD}\"", kafka_conn_id,
                ", ".join(unused), config)
    return env


def _text(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None  # the job says what is wrong with the file
