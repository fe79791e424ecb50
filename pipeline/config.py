"""Typed settings from a TOML file plus the environment, validated before anything runs.

Every problem is a one-line ConfigError naming the key and what to write instead.
"""

from __future__ import annotations

import logging
import os
import re
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal, get_args
from urllib.parse import urlsplit

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

from pipeline.errors import ConfigError
from pipeline.formats import paths, types
from pipeline.formats.avro_schemas import SchemaSource

IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")
# A declared column type (the registry's, formats/types.py), optionally "not null": group 1
# the type, group 4 the "not null".
COLUMN_TYPE = re.compile(rf"^{types.DECLARED}( not null)?$")
SECRET_KEY = re.compile(r"(password|secret|token|sasl\.jaas|credentials)", re.I)
# A run is one transaction: bounded by default, so that a large backlog (a new pipeline on
# an old topic, a long outage) is drained by successive runs of bounded WAL, staging and
# duration instead of one that a task timeout kills and retries forever. 20M records take
# ~2 minutes on 2 cores (docs/benchmarks.md). 0 = no cap.
DEFAULT_MAX_RECORDS_PER_PARTITION = 5_000_000
DEFAULT_MAX_RECORDS_PER_RUN = 20_000_000
RESERVED_COLUMNS = {"topic", "partition", "offset", "kafka_timestamp", "run_id", "ingested_at"}
ENV_BOOTSTRAP = "KAFKA_BOOTSTRAP_SERVERS"
ENV_DATABASE_URL = "PIPELINE_DATABASE_URL"


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # as declared, without " not null": a key of formats/types.py's registry
    required: bool
    source: tuple[str, ...] = ()  # ``from``: the value's path in a record (formats/paths.py)


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap_servers: str
    topics: tuple[str, ...]
    starting_offsets: str = "earliest"
    isolation_level: str = "read_committed"
    max_records_per_partition: int = 0
    max_records_per_run: int = 0
    on_data_loss: str = "fail"
    timeout_seconds: float = 15.0
    mirror_group: str | None = None
    consumer: dict[str, str] = field(default_factory=dict)  # both clients
    spark_consumer: dict[str, str] = field(default_factory=dict)  # Spark's Java client only
    admin_client: dict[str, str] = field(default_factory=dict)  # confluent-kafka only

    def client_config(self) -> dict[str, str]:
        """confluent-kafka (librdkafka) settings for metadata, offsets and the mirror."""
        return {**self.consumer, **self.admin_client, "bootstrap.servers": self.bootstrap_servers}

    def spark_options(self) -> dict[str, str]:
        """Settings for Spark's Kafka source (the Java client), without the kafka. prefix."""
        return {**self.consumer, **self.spark_consumer}


@dataclass(frozen=True)
class Aggregate:
    """One column of an aggregate sink: ``name = "sum(amount)"``; ``of`` is None for
    count(*)."""
    name: str
    function: str  # sum | count | min | max
    of: str | None


SINK_FORMATS = ("raw", "json", "avro", "protobuf")
# The formats whose rows are the declared [sink.columns] (raw's columns are fixed).
COLUMN_FORMATS = ("json", "avro", "protobuf")
SINK_MODES = ("append", "upsert", "aggregate")
# [sink] evolve: "off" (a column the table lacks is an exit-2 error before reading) or
# "add_columns" (added in the publishing transaction: pipeline/store/evolve.py).
Evolve = Literal["off", "add_columns"]
AGGREGATE = re.compile(r"^(sum|count|min|max)\(\s*(\*|[a-z_][a-z0-9_]*)\s*\)$|^count$")


@dataclass(frozen=True)
class SinkSettings:
    format: str
    table: str
    max_bad_records: int = -1
    transform: str | None = None
    columns: tuple[Column, ...] = ()
    # append: one row per record. upsert: the newest record per ``key``. aggregate:
    # ``aggregates`` per ``group_by``, merged additively (docs/reliability.md).
    mode: str = "append"
    key: tuple[str, ...] = ()  # upsert: the business key; aggregate: the group_by columns
    tombstones: str = "delete"  # upsert: a null value with a key deletes | dead_letter
    aggregates: tuple[Aggregate, ...] = ()
    evolve: Evolve = "off"
    envelope: str = "none"  # "debezium": values are change events (formats/debezium.py)

    @property
    def record_format(self) -> str:
        """The executors' record format (formats.registry.FORMATS)."""
        if self.envelope == "debezium":
            return "debezium_avro" if self.format == "avro" else "debezium"
        return self.format

    @property
    def deletes(self) -> bool:
        """Upsert with tombstones that delete: a null-valued record's Kafka key names the
        row to delete."""
        return self.mode == "upsert" and self.tombstones == "delete"


@dataclass(frozen=True)
class SparkSettings:
    master: str = "local[2]"
    min_partitions: int = 0
    conf: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class MetricsSettings:
    """Where a run's Prometheus metrics go (pipeline/driver/metrics.py); neither = nowhere."""
    textfile: str | None = None  # for node_exporter's textfile collector (*.prom)
    pushgateway: str | None = None  # http(s)://host:port of a Pushgateway


@dataclass(frozen=True)
class Settings:
    name: str
    kafka: KafkaSettings
    database_url: str
    schema: str
    sink: SinkSettings
    spark: SparkSettings
    source: str = "<defaults>"
    # The publishing transaction's waits (0 = none): for a lock another session holds on
    # our tables (a DBA's ALTER or VACUUM FULL), and for any one statement - note the COPY
    # that streams results lasts as long as Spark's read.
    lock_timeout_seconds: float = 60.0
    statement_timeout_seconds: float = 0.0
    metrics: MetricsSettings = field(default_factory=MetricsSettings)
    # [schema_registry]: the avro format's writer schemas (None for json and raw).
    schema_registry: SchemaSource | None = None

    def redacted(self) -> dict[str, Any]:
        """What may be printed or stored: no password, no SASL secret."""
        return {
            "name": self.name,
            "kafka": {
                "bootstrap_servers": self.kafka.bootstrap_servers,
                "topics": list(self.kafka.topics),
                "isolation_level": self.kafka.isolation_level,
                "consumer": redact_settings(self.kafka.consumer),
                "spark_consumer": redact_settings(self.kafka.spark_consumer),
                "admin_client": redact_settings(self.kafka.admin_client),
            },
            "database_url": redact_url(self.database_url),
            "sink": {"format": self.sink.format, "table": self.sink.table,
                     "mode": self.sink.mode},
            **({"schema_registry": self.schema_registry.describe()}
               if self.schema_registry else {}),
        }


def redact_url(url: str) -> str:
    """The URL with its password masked (SQLAlchemy's URL parser does the quoting right)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable database url>"


def redact_settings(settings: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if SECRET_KEY.search(k) else v) for k, v in settings.items()}


# Masking by structure, not by the secret's text (a password may be a common word that
# also appears in the message): a URL's password field, the value after a secret key
# ("sasl.password = ...", "'ssl.key.password': '...'"), and password= in a libpq conninfo
# or a JAAS line.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/?#'\"]+")
_SECRET_VALUE = re.compile(
    r"(?P<key>[\w.-]*(?:password|secret|token|sasl\.jaas\.config|credentials)[\w.-]*)"
    r"(?P<sep>(?:[\"']\s*[:=]|\s*=)\s*)"
    r"(?P<value>\\\"(?:(?!\\\").)*\\\"|\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[^\s,;)}\]]+)",
    re.I)


def mask(text: str) -> str:
    """``text`` with every secret it carries, by its place in the text, shown as ***."""
    def url(m: re.Match) -> str:
        # The authority ends at the first / ? #; its user info at the last @ (as urlsplit).
        head, at, host = m.group(0).rpartition("@")
        scheme, _, userinfo = head.partition("://")
        if not at or ":" not in userinfo:
            return m.group(0)
        return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"

    def value(m: re.Match) -> str:
        v = m.group("value")
        quote = v[:2] if v.startswith('\\"') else v[:1] if v[:1] in "'\"" else ""
        return f"{m.group('key')}{m.group('sep')}{quote}***{quote}"

    return _SECRET_VALUE.sub(value, _URL.sub(url, text))


class MaskingFilter(logging.Filter):
    """Log records pass through mask() (install on a handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = mask(record.getMessage()), ()
        return True


MASK_LOGS = MaskingFilter()  # one instance: adding it twice to a handler is a no-op


# ---- parsing ------------------------------------------------------------------------------

# [airflow]: read by airflow_dags/ (the DAGs' schedule, retries, owner, tags, pool, queue
# and the connections), not by the job; checked here so that a mistake fails like any other.
# key -> (type, smallest value for numbers, or None)
_AIRFLOW: dict[str, tuple[type, float | None]] = {
    "schedule": (str, None), "retries": (int, 0), "retry_delay_seconds": (float, 0),
    "max_retry_delay_seconds": (float, 1), "execution_timeout_seconds": (float, 1),
    "owner": (str, None), "tags": (list, None), "pool": (str, None), "pool_slots": (int, 1),
    "queue": (str, None), "spark_conn_id": (str, None), "postgres_conn_id": (str, None),
    "kafka_conn_id": (str, None),
}


def _check_airflow(table: dict[str, Any]) -> None:
    for key, (typ, least) in _AIRFLOW.items():
        value = _get(table, "airflow", key, typ, None)
        if value is None:
            continue
        if least is not None and value < least:
            raise ConfigError(f"'airflow.{key}' must be >= {least:g}, got {value!r}")
        if typ is str and not value.strip():
            raise ConfigError(f"'airflow.{key}' must not be empty")
        if typ is list and not all(isinstance(t, str) and t.strip() for t in value):
            raise ConfigError(f"'airflow.{key}' must be a list of non-empty strings")


_SECTIONS: dict[str, set[str]] = {
    "pipeline": {"name"},
    "kafka": {"bootstrap_servers", "topics", "starting_offsets", "isolation_level",
              "max_records_per_partition", "max_records_per_run", "on_data_loss",
              "timeout_seconds", "mirror_group",
              "consumer", "spark_consumer", "admin_client"},
    "database": {"url", "schema", "lock_timeout_seconds", "statement_timeout_seconds"},
    "sink": {"format", "table", "max_bad_records", "transform", "columns", "mode", "key",
             "tombstones", "group_by", "aggregates", "evolve", "envelope"},
    "spark": {"master", "min_partitions", "conf"},
    "metrics": {"textfile", "pushgateway"},
    "schema_registry": {"url", "user", "password", "ssl_ca_location", "schemas_dir",
                        "timeout_seconds"},
    "airflow": set(_AIRFLOW),
}


def _check_keys(section: str, table: dict[str, Any], allowed: set[str]) -> None:
    for key in table:
        if key not in allowed:
            raise ConfigError(
                f"unknown key '{section}.{key}' in config; allowed: {', '.join(sorted(allowed))}")


def _get(table: dict[str, Any], section: str, key: str, typ: type | tuple, default: Any = ...):
    if key not in table:
        if default is ...:
            raise ConfigError(f"missing required key '{section}.{key}'")
        return default
    value = table[key]
    # TOML ints are fine where floats are expected; bools are not ints here.
    if typ is float and isinstance(value, int) and not isinstance(value, bool):
        value = float(value)
    if isinstance(value, bool) and typ is not bool:
        raise ConfigError(f"'{section}.{key}' must be {_tname(typ)}, got a boolean")
    if not isinstance(value, typ):
        raise ConfigError(
            f"'{section}.{key}' must be {_tname(typ)}, got {type(value).__name__} {value!r}")
    return value


def _tname(typ: type | tuple) -> str:
    names = {str: "a string", int: "an integer", float: "a number", list: "a list",
             dict: "a table", bool: "true or false"}
    if isinstance(typ, tuple):
        return " or ".join(names.get(t, t.__name__) for t in typ)
    return names.get(typ, typ.__name__)


def _identifier(value: str, key: str) -> str:
    if not IDENTIFIER.match(value):
        raise ConfigError(
            f"'{key}' = {value!r} is not a safe SQL identifier: use lowercase letters, digits "
            "and _ (at most 48 characters, not starting with a digit)")
    return value


def _choice(value: str, key: str, choices: tuple[str, ...]) -> str:
    if value not in choices:
        raise ConfigError(f"'{key}' = {value!r}: must be one of {', '.join(choices)}")
    return value


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


def _expand_env(value: str, key: str, env: dict[str, str]) -> str:
    def sub(m: re.Match) -> str:
        if m.group(1) not in env:
            raise ConfigError(f"'{key}' refers to ${{{m.group(1)}}}, which is not set")
        return env[m.group(1)]
    return _ENV_REF.sub(sub, value)


def _client_settings(kafka: dict[str, Any], name: str, env: dict[str, str]) -> dict[str, str]:
    """A pass-through table of Kafka client settings; ${VAR} is read from the environment."""
    table = _get(kafka, "kafka", name, dict, {})
    out = {}
    for key, value in table.items():
        if not isinstance(value, (str, int, bool)):
            raise ConfigError(f"'kafka.{name}.{key}' must be a string, number or boolean")
        if key in ("bootstrap.servers", "isolation.level", "group.id", "enable.auto.commit"):
            raise ConfigError(
                f"'kafka.{name}.{key}' is managed by the pipeline; set it elsewhere or drop it")
        text = str(value).lower() if isinstance(value, bool) else str(value)
        out[key] = _expand_env(text, f"kafka.{name}.{key}", env)
    return out


def parse_settings(doc: dict[str, Any], source: str = "<dict>",
                   environ: dict[str, str] | None = None) -> Settings:
    env = os.environ if environ is None else environ
    _check_keys("config", doc, set(_SECTIONS))
    for section, allowed in _SECTIONS.items():
        value = doc.get(section, {})
        if not isinstance(value, dict):
            raise ConfigError(f"'{section}' must be a table ([{section}])")
        _check_keys(section, value, allowed)

    _check_airflow(doc.get("airflow", {}))
    p = doc.get("pipeline", {})
    name = _identifier(_get(p, "pipeline", "name", str), "pipeline.name")

    k = doc.get("kafka", {})
    topics = _get(k, "kafka", "topics", list)
    if not topics or not all(isinstance(t, str) and re.match(r"^[A-Za-z0-9._-]{1,249}$", t)
                             for t in topics):
        raise ConfigError("'kafka.topics' must be a non-empty list of Kafka topic names")
    consumer, spark_consumer, admin_client = (
        _client_settings(k, name, env) for name in ("consumer", "spark_consumer", "admin_client"))
    max_records = _get(k, "kafka", "max_records_per_partition", int,
                       DEFAULT_MAX_RECORDS_PER_PARTITION)
    if max_records < 0:
        raise ConfigError("'kafka.max_records_per_partition' must be >= 0 (0 = no cap)")
    max_run = _get(k, "kafka", "max_records_per_run", int, DEFAULT_MAX_RECORDS_PER_RUN)
    if max_run < 0:
        raise ConfigError("'kafka.max_records_per_run' must be >= 0 (0 = no cap)")
    timeout = _get(k, "kafka", "timeout_seconds", float, 15.0)
    if timeout <= 0:
        raise ConfigError("'kafka.timeout_seconds' must be > 0")
    kafka = KafkaSettings(
        bootstrap_servers=env.get(ENV_BOOTSTRAP) or _get(k, "kafka", "bootstrap_servers", str),
        topics=tuple(topics),
        starting_offsets=_choice(_get(k, "kafka", "starting_offsets", str, "earliest"),
                                 "kafka.starting_offsets", ("earliest", "latest")),
        isolation_level=_choice(_get(k, "kafka", "isolation_level", str, "read_committed"),
                                "kafka.isolation_level", ("read_committed", "read_uncommitted")),
        max_records_per_partition=max_records,
        max_records_per_run=max_run,
        on_data_loss=_choice(_get(k, "kafka", "on_data_loss", str, "fail"),
                             "kafka.on_data_loss", ("fail", "skip")),
        timeout_seconds=timeout,
        mirror_group=_get(k, "kafka", "mirror_group", str, None),
        consumer=consumer,
        spark_consumer=spark_consumer,
        admin_client=admin_client,
    )

    d = doc.get("database", {})
    # ${VAR} as in the client tables: the password (percent-encoded) stays out of the file.
    url = env.get(ENV_DATABASE_URL) or _expand_env(_get(d, "database", "url", str),
                                                   "database.url", env)
    if not url.startswith(("postgresql://", "postgres://")):
        raise ConfigError(
            "'database.url' must be a postgresql:// URL (or set PIPELINE_DATABASE_URL)")
    try:
        make_url(url)
    except ArgumentError:
        raise ConfigError("'database.url' is not a valid URL: write "
                          "postgresql://user:password@host:port/database") from None
    schema = _identifier(_get(d, "database", "schema", str, "public"), "database.schema")
    timeouts = {}
    for key, default in (("lock_timeout_seconds", 60.0), ("statement_timeout_seconds", 0.0)):
        value = _get(d, "database", key, float, default)
        if value < 0:
            raise ConfigError(f"'database.{key}' must be >= 0 seconds (0 = no limit)")
        timeouts[key] = float(value)

    s = doc.get("sink", {})
    fmt = _choice(_get(s, "sink", "format", str, "raw"), "sink.format", SINK_FORMATS)
    table = _identifier(_get(s, "sink", "table", str), "sink.table")
    max_bad = _get(s, "sink", "max_bad_records", int, -1)
    if max_bad < -1:
        raise ConfigError("'sink.max_bad_records' must be >= 0, or -1 for no limit")
    transform = _get(s, "sink", "transform", str, None)
    if transform is not None and not re.match(r"^[\w.]+:\w+$", transform):
        raise ConfigError(f"'sink.transform' = {transform!r}: write it as 'module:function'")
    columns = [_column(cname, spec)
               for cname, spec in _get(s, "sink", "columns", dict, {}).items()]
    if fmt in COLUMN_FORMATS and not columns:
        raise ConfigError(f"sink.format = '{fmt}' needs at least one column in [sink.columns]")
    if fmt == "raw" and columns:
        raise ConfigError("[sink.columns] is only for sink.format = 'json' or 'avro'")
    for c in columns if transform is not None else ():
        # The transform path parses JSON with Spark's from_json by column name (avro and
        # protobuf: decoded_columns.py, paths too), scalars only.
        if (c.source and fmt == "json") or not types.column_type(c.type).scalar:
            what = f"from = {paths.label(c.source)!r}" if c.source else c.type
            raise ConfigError(
                f"'sink.columns.{c.name}' ({what}) is not supported with 'sink.transform' = "
                f"{transform!r} yet: remove sink.transform, or read the field in the transform")
    sink = _envelope(s, _evolve(s, _sink_mode(s, SinkSettings(fmt, table, max_bad, transform,
                                                              tuple(columns)))))

    sp = doc.get("spark", {})
    spark_conf = _get(sp, "spark", "conf", dict, {})
    spark = SparkSettings(
        master=_get(sp, "spark", "master", str, "local[2]"),
        min_partitions=_get(sp, "spark", "min_partitions", int, 0),
        conf={ck: str(cv) for ck, cv in spark_conf.items()},
    )
    return Settings(name, kafka, url, schema, sink, spark, source, **timeouts,
                    metrics=_metrics(doc.get("metrics", {}), env),
                    schema_registry=_schema_registry(doc, fmt, env))


def _column(cname: str, spec: Any) -> Column:
    """One [sink.columns] entry: ``name = "type"`` or ``name = { type = "type", from =
    "path" }`` (the value's path in a record: formats/paths.py)."""
    where = f"sink.columns.{cname}"
    _identifier(cname, where)
    if cname in RESERVED_COLUMNS:
        raise ConfigError(f"'{where}' is reserved; rename the column")
    source: tuple[str, ...] = ()
    ctype = spec
    if isinstance(spec, dict):
        unknown = set(spec) - {"type", "from"}
        if unknown or "type" not in spec:
            raise ConfigError(f"'{where}' = {spec!r}: write {{ type = \"long\", from = "
                              "\"customer.id\" }} (keys type and from only)")
        ctype = spec["type"]
        if "from" in spec:
            try:
                source = paths.parse(spec["from"])
            except paths.BadPath as e:
                raise ConfigError(f"'{where}.from' = {spec['from']!r} {e}") from None
            if source == (cname,):
                source = ()  # the column's own name: the short form
    if not isinstance(ctype, str) or not (m := COLUMN_TYPE.match(ctype.strip().lower())):
        raise ConfigError(f"'{where}' = {ctype!r}: use {types.SPELLED}, optionally followed "
                          "by ' not null'")
    return Column(cname, m.group(1), m.group(4) is not None, source)


def _sink_mode(s: dict[str, Any], sink: SinkSettings) -> SinkSettings:
    """[sink] mode and what it needs: key (upsert), group_by and aggregates (aggregate)."""
    mode = _choice(_get(s, "sink", "mode", str, "append"), "sink.mode", SINK_MODES)
    declared = {c.name: c for c in sink.columns}
    for key, wanted in (("key", "upsert"), ("tombstones", "upsert"),
                        ("group_by", "aggregate"), ("aggregates", "aggregate")):
        if key in s and mode != wanted:
            raise ConfigError(f"'sink.{key}' is only for sink.mode = '{wanted}' (this is "
                              f"'{mode}')")
    if mode == "append":
        return sink
    if sink.format not in COLUMN_FORMATS:
        raise ConfigError(f"sink.mode = '{mode}' needs sink.format = 'json' or 'avro': its "
                          f"{'key' if mode == 'upsert' else 'group_by'} columns are declared "
                          "in [sink.columns]")
    name = "key" if mode == "upsert" else "group_by"
    key = _get(s, "sink", name, list)
    if not key or not all(isinstance(k, str) for k in key) or len(set(key)) != len(key):
        raise ConfigError(f"'sink.{name}' must be a non-empty list of distinct column names")
    for k in key:
        if k not in declared:
            raise ConfigError(f"'sink.{name}' names '{k}', which is not in [sink.columns]; "
                              f"declare it there (e.g. {k} = \"string not null\")")
        if declared[k].type in ("double",):
            raise ConfigError(f"'sink.{name}' column '{k}' is a double: floating-point keys "
                              "do not compare exactly; use long, string or decimal(p,s)")
        if not types.column_type(declared[k].type).scalar:
            raise ConfigError(f"'sink.{name}' column '{k}' is a {declared[k].type}: a key "
                              "holds one value; use long, string or decimal(p,s)")
    # Columns the mode's own tables add (tables.py): a declared one would clash.
    taken = {"upsert": {"deleted_at"}, "aggregate": {"updated_at"}}[mode]
    for k in key:
        if k in taken:
            raise ConfigError(f"'sink.{name}' column '{k}' clashes with a column of the "
                              f"{mode} tables; rename it")
    if mode == "upsert" and "_tombstone" in declared:
        raise ConfigError("'sink.columns._tombstone' is reserved for an upsert sink; rename it")
    # Key columns are required: a record without one becomes a dead letter.
    columns = tuple(replace(c, required=c.required or c.name in key) for c in sink.columns)
    if mode == "upsert":
        tombstones = _choice(_get(s, "sink", "tombstones", str, "delete"), "sink.tombstones",
                             ("delete", "dead_letter"))
        if sink.transform and tombstones == "delete":
            # A tombstone (null value) never reaches a transform, which sees parsed values;
            # deleting by the Kafka key beside it is not built yet.
            raise ConfigError(
                f"'sink.transform' = {sink.transform!r} with sink.mode = 'upsert' needs "
                "sink.tombstones = 'dead_letter' (the default 'delete' is not supported with "
                "a transform yet): add tombstones = \"dead_letter\" to [sink], and a record "
                "with a null value becomes a dead letter instead of deleting its key")
        return replace(sink, columns=columns, mode=mode, key=tuple(key), tombstones=tombstones)
    aggregates = []
    for aname, spec in _get(s, "sink", "aggregates", dict).items():
        _identifier(aname, f"sink.aggregates.{aname}")
        where = f"'sink.aggregates.{aname}'"
        if aname in key or aname in RESERVED_COLUMNS | {"updated_at"}:
            raise ConfigError(f"{where} clashes with a group_by or reserved column; rename it")
        m = AGGREGATE.match(spec.strip().lower()) if isinstance(spec, str) else None
        if not m:
            raise ConfigError(f"{where} = {spec!r}: write sum(column), count(*), "
                              "count(column), min(column) or max(column)")
        function, of = m.group(1) or "count", m.group(2)
        of = None if of in (None, "*") else of
        if of is None and function != "count":
            raise ConfigError(f"{where}: {function}(*) is not defined; name a column")
        if of is not None and of not in declared:
            raise ConfigError(f"{where} aggregates '{of}', which is not in [sink.columns]")
        kind = declared[of].type if of else "long"
        if function == "sum" and types.column_type(kind).sum is None:
            raise ConfigError(f"{where}: sum() needs a number column; '{of}' is {kind}")
        if function in ("min", "max") and not types.column_type(kind).scalar:
            raise ConfigError(f"{where}: {function}() of a {kind} is not defined; aggregate "
                              "a scalar column")
        if function in ("min", "max") and kind == "boolean":
            raise ConfigError(f"{where}: {function}() of a boolean is not defined; use "
                              "count(column) of the rows you want, or a long 0/1 column")
        aggregates.append(Aggregate(aname, function, of))
    if not aggregates:
        raise ConfigError("sink.mode = 'aggregate' needs at least one column in "
                          "[sink.aggregates], e.g. total = \"sum(amount)\"")
    return replace(sink, columns=columns, mode=mode, key=tuple(key),
                   aggregates=tuple(aggregates))


def _evolve(s: dict[str, Any], sink: SinkSettings) -> SinkSettings:
    """[sink] evolve: whether a declared column the table lacks is added by the run."""
    evolve = _choice(_get(s, "sink", "evolve", str, "off"), "sink.evolve", get_args(Evolve))
    if evolve == "off":
        return sink
    if sink.format not in COLUMN_FORMATS:
        raise ConfigError("'sink.evolve' adds columns declared in [sink.columns]: it is for "
                          "sink.format = 'json' or 'avro' (a raw table's columns are fixed)")
    if sink.mode == "aggregate":
        raise ConfigError(
            "'sink.evolve' = 'add_columns' is refused for sink.mode = 'aggregate': a new "
            "aggregate column would total only the records read from now on, beside groups "
            "that counted everything before; add it by hand and rebuild the totals (see "
            "docs/operations.md), or remove sink.evolve")
    return replace(sink, evolve=evolve)


def _envelope(s: dict[str, Any], sink: SinkSettings) -> SinkSettings:
    """[sink] envelope: "debezium" reads change events into an upsert sink."""
    envelope = _choice(_get(s, "sink", "envelope", str, "none"), "sink.envelope",
                       ("none", "debezium"))
    if envelope == "none":
        return sink
    if sink.format not in ("json", "avro") or sink.transform:
        raise ConfigError("'sink.envelope' = 'debezium' needs sink.format = 'json' or 'avro' "
                          "and no sink.transform (Protobuf change events and transforms: not "
                          "yet)")
    if sink.mode != "upsert" or not sink.deletes:
        raise ConfigError("'sink.envelope' = 'debezium' needs sink.mode = 'upsert' with key = "
                          "[the source table's key columns] and tombstones = 'delete' (the "
                          "default): a change event upserts or deletes its row")
    return replace(sink, envelope=envelope)


def _schema_registry(doc: dict[str, Any], fmt: str, env: dict[str, str]) -> SchemaSource | None:
    """[schema_registry]: where the avro format's writer schemas come from, a registry's
    url (basic auth via ${VAR}) or a folder of <id>.avsc files."""
    r = doc.get("schema_registry")
    if fmt not in ("avro", "protobuf"):
        if r is not None:
            raise ConfigError("[schema_registry] is only for sink.format = 'avro' or "
                              "'protobuf'; remove it")
        return None
    r = r or {}
    url = _get(r, "schema_registry", "url", str, None)
    folder = _get(r, "schema_registry", "schemas_dir", str, None)
    if (url is None) == (folder is None):
        raise ConfigError(f"sink.format = '{fmt}' needs exactly one of schema_registry.url (a "
                          "Confluent-API registry) or schema_registry.schemas_dir (a folder "
                          "of <id>.avsc or <id>.proto files) in [schema_registry]")
    timeout = _get(r, "schema_registry", "timeout_seconds", float, 10.0)
    if timeout <= 0:
        raise ConfigError("'schema_registry.timeout_seconds' must be > 0")
    if folder is not None:
        for key in ("user", "password", "ssl_ca_location"):
            if key in r:
                raise ConfigError(f"'schema_registry.{key}' is for a registry url; "
                                  "schemas_dir reads files")
        path = Path(_expand_env(folder, "schema_registry.schemas_dir", env)).resolve()
        if not path.is_dir():
            raise ConfigError(f"'schema_registry.schemas_dir' = {folder!r} is not a folder; "
                              "point it at the folder of <id>.avsc files")
        return SchemaSource(schemas_dir=str(path), timeout_seconds=timeout)
    url = _expand_env(url, "schema_registry.url", env)
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"'schema_registry.url' = {mask(url)!r}: write the "
                          "registry's URL as http(s)://host:port (Apicurio: "
                          ".../apis/ccompat/v7)")
    user, password = (_expand_env(v, f"schema_registry.{k}", env) if v is not None else None
                      for k, v in (("user", _get(r, "schema_registry", "user", str, None)),
                                   ("password", _get(r, "schema_registry", "password", str,
                                                     None))))
    if password is not None and user is None:
        raise ConfigError("'schema_registry.password' needs schema_registry.user")
    ca = _get(r, "schema_registry", "ssl_ca_location", str, None)
    return SchemaSource(url=url, user=user, password=password, ssl_ca_location=ca,
                        timeout_seconds=timeout)


def _metrics(m: dict[str, Any], env: dict[str, str]) -> MetricsSettings:
    textfile = _get(m, "metrics", "textfile", str, None)
    if textfile is not None and not textfile.endswith(".prom"):
        raise ConfigError(f"'metrics.textfile' = {textfile!r}: node_exporter's textfile "
                          "collector reads only *.prom files; end the name in .prom")
    gateway = _get(m, "metrics", "pushgateway", str, None)
    if gateway is not None:
        gateway = _expand_env(gateway, "metrics.pushgateway", env)
        parts = urlsplit(gateway)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"'metrics.pushgateway' = {gateway!r}: write the Pushgateway's "
                              "URL as http://host:9091")
    return MetricsSettings(textfile, gateway)


def load_settings(path: str | Path, environ: dict[str, str] | None = None) -> Settings:
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"config file {path} not found; pass --config conf/local.toml") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path} is not valid TOML: {e}") from None
    return parse_settings(doc, str(path), environ)


def with_overrides(settings: Settings, **kafka_changes: Any) -> Settings:
    return replace(settings, kafka=replace(settings.kafka, **kafka_changes))
