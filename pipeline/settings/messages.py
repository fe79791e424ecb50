"""pydantic's ValidationError as the one line ConfigError has always said: the key, what is
wrong with its value, and what to write ("'kafka.timeout_seconds' must be a number, got str
'soon'"). Of several problems the first is told, unknown keys and tables before values, as
the file would be read."""

from __future__ import annotations

import re
import types as pytypes
import typing
from typing import Any

from pydantic import BaseModel, SecretStr, ValidationError
from pydantic.fields import FieldInfo

from pipeline.errors import ConfigError

_KIND = {"string_type": "a string", "int_type": "an integer", "float_type": "a number",
         "list_type": "a list", "dict_type": "a table", "model_type": "a table",
         "bool_type": "true or false"}
_TABLE_TYPES = ("dict_type", "model_type", "model_attributes_type")


def config_error(error: ValidationError, root: type[BaseModel]) -> ConfigError:
    errors = sorted(error.errors(), key=lambda e: e["type"] != "extra_forbidden"
                    and not (len(e["loc"]) == 1 and e["type"] in _TABLE_TYPES))
    return ConfigError(message(errors[0], root))


def dotted(loc: tuple[str, ...]) -> str:
    """A key's path as TOML spells it: a part that is not a bare key (a topic's name in
    [sink.topics."a.b"]) quoted."""
    return ".".join(p if _BARE.match(p) else f'"{p}"' for p in loc)


_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def message(e: dict[str, Any], root: type[BaseModel]) -> str:
    loc = tuple(str(p) for p in e["loc"])
    key, kind, value = dotted(loc), e["type"], e.get("input")
    ctx = e.get("ctx") or {}
    if kind == "config":
        return ctx["message"]
    if kind == "config_key":
        return f"'{key}' {ctx['message']}"
    if kind == "extra_forbidden":
        section = dotted(loc[:-1]) or "config"
        allowed = sorted(_fields(root, loc[:-1]))
        return f"unknown key '{section}.{loc[-1]}' in config; allowed: {', '.join(allowed)}"
    if kind == "missing":
        return f"missing required key '{key}'"
    if kind == "literal_error" and not isinstance(value, str):
        kind = "string_type"  # the choices are words
    if len(loc) == 1 and kind in _TABLE_TYPES:
        return f"'{key}' must be a table ([{key}])"
    if kind in _KIND:
        got = ("a boolean" if isinstance(value, bool) else type(value).__name__
               if _secret(root, loc) else f"{type(value).__name__} {value!r}")
        return f"'{key}' must be {_KIND[kind]}, got {got}"
    if kind == "literal_error":
        choices = ", ".join(re.findall(r"'([^']*)'", ctx.get("expected", "")))
        return f"'{key}' = {value!r}: must be one of {choices}"
    hint = _hint(root, loc)
    bounds = {"greater_than_equal": ("ge", ">="), "greater_than": ("gt", ">"),
              "less_than_equal": ("le", "<="), "less_than": ("lt", "<")}
    if kind in bounds:
        name, op = bounds[kind]
        bound = ctx[name]
        bound = int(bound) if float(bound).is_integer() else f"{bound:g}"
        return f"'{key}' must be {op} {bound}, got {value!r}{hint}"
    return f"'{key}': {e['msg']}{hint}"  # a check without a message of its own


def _model(annotation: Any) -> type[BaseModel] | None:
    """The table model of a field's annotation (``KafkaTable``, ``KafkaTable | None``)."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if typing.get_origin(annotation) in (typing.Union, pytypes.UnionType):
        return next(filter(None, map(_model, typing.get_args(annotation))), None)
    return None


def _tables_of(annotation: Any) -> type[BaseModel] | None:
    """The model of a table of named tables (``dict[str, RouteTable]``: [sink.topics.*])."""
    if typing.get_origin(annotation) is dict:
        return _model(typing.get_args(annotation)[1])
    return None


def _field(root: type[BaseModel], loc: tuple[str, ...]) -> tuple[type[BaseModel] | None,
                                                                  FieldInfo | None]:
    model, info, named = root, None, None
    for part in loc:
        if named is not None:  # a name in a table of named tables: its model's keys next
            model, named = named, None
            continue
        if model is None:
            return None, None
        info = next((f for n, f in model.model_fields.items() if (f.alias or n) == part), None)
        if info is None:
            return None, None
        model, named = _model(info.annotation), _tables_of(info.annotation)
    return model, info


def _fields(root: type[BaseModel], loc: tuple[str, ...]) -> list[str]:
    """The keys the table at ``loc`` allows (by their names in the file)."""
    model = _field(root, loc)[0] if loc else root
    return [f.alias or n for n, f in model.model_fields.items()] if model else []


def _hint(root: type[BaseModel], loc: tuple[str, ...]) -> str:
    info = _field(root, loc)[1]
    return f" ({info.description})" if info is not None and info.description else ""


def _secret(root: type[BaseModel], loc: tuple[str, ...]) -> bool:
    """Whether the key holds a secret, whose value no message may show."""
    info = _field(root, loc)[1]
    return info is not None and SecretStr in (info.annotation, *typing.get_args(info.annotation))
