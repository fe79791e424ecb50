"""[sink] mode and what it needs: ``key`` (and ``tombstones``) for upsert, ``group_by`` and
``aggregates`` for aggregate; checked against the declared columns. Plain values in, the
fields of the sink's value out (settings/sink.py builds SinkSettings from them)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Any

from pipeline.errors import ConfigError
from pipeline.formats import types
from pipeline.settings.base import identifier
from pipeline.settings.columns import RESERVED_COLUMNS, Column

AGGREGATE = re.compile(r"^(sum|count|min|max)\(\s*(\*|[a-z_][a-z0-9_]*)\s*\)$|^count$")


@dataclass(frozen=True)
class Aggregate:
    """One column of an aggregate sink: ``name = "sum(amount)"``; ``of`` is None for
    count(*)."""
    name: str
    function: str  # sum | count | min | max
    of: str | None


_FOR_MODE = {"key": "upsert", "tombstones": "upsert", "group_by": "aggregate",
             "aggregates": "aggregate"}
MODE_KEYS = tuple(_FOR_MODE)  # the [sink] keys one mode reads


def mode_fields(mode: str, columns: tuple[Column, ...], transform: str | None, *,
                key: list | None = None, tombstones: str | None = None,
                group_by: list | None = None, aggregates: dict[str, Any] | None = None
                ) -> dict[str, Any]:
    """The fields of SinkSettings that ``mode`` sets (columns, mode, key, tombstones,
    aggregates), from the [sink] keys as given (None: absent); none for append."""
    given = {"key": key, "tombstones": tombstones, "group_by": group_by,
             "aggregates": aggregates}
    for name, wanted in _FOR_MODE.items():
        if given[name] is not None and mode != wanted:
            raise ConfigError(f"'sink.{name}' is only for sink.mode = '{wanted}' (this is "
                              f"'{mode}')")
    if mode == "append":
        return {}
    if not columns:  # a raw sink: its columns are fixed, none declared (settings/sink.py)
        raise ConfigError(f"sink.mode = '{mode}' needs sink.format = 'json', 'avro' or "
                          f"'protobuf': its {'key' if mode == 'upsert' else 'group_by'} "
                          "columns are declared in [sink.columns]")
    name = "key" if mode == "upsert" else "group_by"
    keys = given[name]
    if keys is None:
        raise ConfigError(f"missing required key 'sink.{name}'")
    declared = {c.name: c for c in columns}
    _check_key(name, keys, declared, mode)
    # Key columns are required: a record without one becomes a dead letter.
    columns = tuple(replace(c, required=c.required or c.name in keys) for c in columns)
    if mode == "upsert":
        # Columns of the upsert's own staging and tables (tables.record_batch, sinks/upsert.py).
        for taken in ("_tombstone", "_unavailable", "_order_time"):
            if taken in declared:
                raise ConfigError(f"'sink.columns.{taken}' is reserved for an upsert sink; "
                                  "rename it")
        for taken in declared:
            if taken.startswith("_oldkey_"):  # a change event's old key (tables.OLD_KEY)
                raise ConfigError(f"'sink.columns.{taken}': names starting with '_oldkey_' "
                                  "are reserved for an upsert sink; rename it")
        tombstones = tombstones or "delete"
        if transform and tombstones == "delete":
            # A tombstone (null value) never reaches a transform, which sees parsed values;
            # deleting by the Kafka key beside it is not built yet.
            raise ConfigError(
                f"'sink.transform' = {transform!r} with sink.mode = 'upsert' needs "
                "sink.tombstones = 'dead_letter' (the default 'delete' is not supported with "
                "a transform yet): add tombstones = \"dead_letter\" to [sink], and a record "
                "with a null value becomes a dead letter instead of deleting its key")
        return {"columns": columns, "mode": mode, "key": tuple(keys), "tombstones": tombstones}
    if aggregates is None:
        raise ConfigError("missing required key 'sink.aggregates'")
    made = [_aggregate(aname, spec, keys, declared) for aname, spec in aggregates.items()]
    if not made:
        raise ConfigError("sink.mode = 'aggregate' needs at least one column in "
                          "[sink.aggregates], e.g. total = \"sum(amount)\"")
    return {"columns": columns, "mode": mode, "key": tuple(keys), "aggregates": tuple(made)}


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
