"""What every table of a pipeline's config file shares (pipeline/settings/*.py describe one
table each, as a pydantic model): TOML's types taken as they are (strict: "10" is not a
number, true is not 1; an integer is a number), unknown keys refused, values frozen; and
the errors a check raises when pydantic's own would not say what to fix (messages.py turns
every error into ConfigError's one line)."""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator, BaseModel, ConfigDict
from pydantic_core import PydanticCustomError

from pipeline.errors import ConfigError

IDENTIFIER = re.compile(r"^[a-z_][a-z0-9_]{0,47}$")
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")


class Table(BaseModel):
    """One [table] of the file."""
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


def about_key(message: str) -> PydanticCustomError:
    """An error messages.py prefixes with the key: about_key("must not be empty") ->
    "'airflow.owner' must not be empty"."""
    return PydanticCustomError("config_key", "{message}", {"message": message})


def whole(message: str) -> PydanticCustomError:
    """An error whose message names its key itself: passed on as it is."""
    return PydanticCustomError("config", "{message}", {"message": message})


def _not_empty(value: str) -> str:
    if not value.strip():
        raise about_key("must not be empty")
    return value


def _identifier(value: str) -> str:
    if not IDENTIFIER.match(value):
        raise about_key(f"= {value!r} is not a safe SQL identifier: use lowercase letters, "
                        "digits and _ (at most 48 characters, not starting with a digit)")
    return value


NonEmpty = Annotated[str, AfterValidator(_not_empty)]
Identifier = Annotated[str, AfterValidator(_identifier)]


def identifier(value: str, key: str) -> str:
    """The same check outside a model (a column's or an aggregate's name)."""
    if not IDENTIFIER.match(value):
        raise ConfigError(
            f"'{key}' = {value!r} is not a safe SQL identifier: use lowercase letters, digits "
            "and _ (at most 48 characters, not starting with a digit)")
    return value


def expand_env(value: str, key: str, env: dict[str, str]) -> str:
    """``${VAR}`` in a value, read from the environment (secrets stay out of the file)."""
    def sub(m: re.Match) -> str:
        if m.group(1) not in env:
            raise ConfigError(f"'{key}' refers to ${{{m.group(1)}}}, which is not set")
        return env[m.group(1)]
    return _ENV_REF.sub(sub, value)
