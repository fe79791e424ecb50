"""[sink.columns]: the result table's declared columns, ``name = "type"`` or ``name = { type =
"type", from = "path" }`` (the value's path in a record: formats/paths.py)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from pipeline.errors import ConfigError
from pipeline.formats import paths, types
from pipeline.settings.base import identifier

# A declared column type (the registry's, formats/types.py), optionally "not null": group 1
# the type, group 4 the "not null".
COLUMN_TYPE = re.compile(rf"^{types.DECLARED}( not null)?$")
RESERVED_COLUMNS = {"topic", "partition", "offset", "kafka_timestamp", "run_id", "ingested_at"}


@dataclass(frozen=True)
class Column:
    name: str
    type: str  # as declared, without " not null": a key of formats/types.py's registry
    required: bool
    source: tuple[str, ...] = ()  # ``from``: the value's path in a record (formats/paths.py)


def column(cname: str, spec: Any) -> Column:
    """One [sink.columns] entry."""
    where = f"sink.columns.{cname}"
    identifier(cname, where)
    if cname in RESERVED_COLUMNS:
        raise ConfigError(f"'{where}' is reserved; rename the column")
    source: tuple[str, ...] = ()
    ctype = spec
    if isinstance(spec, dict):
        unknown = set(spec) - {"type", "from"}
        if unknown or "type" not in spec:
            raise ConfigError(f"'{where}' = {spec!r}: write {{ type = \"long\", from = "
                              "\"customer.id\" } (keys type and from only)")
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
