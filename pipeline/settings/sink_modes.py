"""[sink] mode and what it needs: ``key`` (and ``tombstones``) for upsert, ``group_by`` and
``aggregates`` for aggregate; checked against the declared columns."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import TYPE_CHECKING

from pipeline.errors import ConfigError
from pipeline.formats import types
from pipeline.settings.base import identifier
from pipeline.settings.columns import RESERVED_COLUMNS, Column
from pipeline.settings.sink import COLUMN_FORMATS, Aggregate, SinkSettings

if TYPE_CHECKING:
    from pipeline.settings.sink import SinkTable

AGGREGATE = re.compile(r"^(sum|count|min|max)\(\s*(\*|[a-z_][a-z0-9_]*)\s*\)$|^count$")
_FOR_MODE = (("key", "upsert"), ("tombstones", "upsert"), ("group_by", "aggregate"),
             ("aggregates", "aggregate"))


def with_mode(s: SinkTable, sink: SinkSettings) -> SinkSettings:
    mode = s.mode
    for key, wanted in _FOR_MODE:
        if getattr(s, key) is not None and mode != wanted:
            raise ConfigError(f"'sink.{key}' is only for sink.mode = '{wanted}' (this is "
                              f"'{mode}')")
    if mode == "append":
        return sink
    if sink.format not in COLUMN_FORMATS:
        raise ConfigError(f"sink.mode = '{mode}' needs sink.format = 'json' or 'avro': its "
                          f"{'key' if mode == 'upsert' else 'group_by'} columns are declared "
                          "in [sink.columns]")
    name = "key" if mode == "upsert" else "group_by"
    key = getattr(s, name)
    if key is None:
        raise ConfigError(f"missing required key 'sink.{name}'")
    declared = {c.name: c for c in sink.columns}
    _check_key(name, key, declared, mode)
    # Key columns are required: a record without one becomes a dead letter.
    columns = tuple(replace(c, required=c.required or c.name in key) for c in sink.columns)
    if mode == "upsert":
        # Columns of the upsert's own staging and tables (tables.record_batch, sinks/upsert.py).
        for taken in ("_tombstone", "_unavailable", "_order_time"):
            if taken in declared:
                raise ConfigError(f"'sink.columns.{taken}' is reserved for an upsert sink; "
                                  "rename it")
        tombstones = s.tombstones or "delete"
        if sink.transform and tombstones == "delete":
            # A tombstone (null value) never reaches a transform, which sees parsed values;
            # deleting by the Kafka key beside it is not built yet.
            raise ConfigError(
                f"'sink.transform' = {sink.transform!r} with sink.mode = 'upsert' needs "
                "sink.tombstones = 'dead_letter' (the default 'delete' is not supported with "
                "a transform yet): add tombstones = \"dead_letter\" to [sink], and a record "
                "with a null value becomes a dead letter instead of deleting its key")
        return replace(sink, columns=columns, mode=mode, key=tuple(key), tombstones=tombstones)
    if s.aggregates is None:
        raise ConfigError("missing required key 'sink.aggregates'")
    aggregates = [_aggregate(aname, spec, key, declared) for aname, spec in s.aggregates.items()]
    if not aggregates:
        raise ConfigError("sink.mode = 'aggregate' needs at least one column in "
                          "[sink.aggregates], e.g. total = \"sum(amount)\"")
    return replace(sink, columns=columns, mode=mode, key=tuple(key),
                   aggregates=tuple(aggregates))


def _check_key(name: str, key: list, declared: dict[str, Column], mode: str) -> None:
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


def _aggregate(aname: str, spec: object, key: list, declared: dict[str, Column]) -> Aggregate:
    identifier(aname, f"sink.aggregates.{aname}")
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
    return Aggregate(aname, function, of)
