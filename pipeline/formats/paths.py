"""Where a declared column's value is in a record: its source path (``[sink.columns]``'s
``from``), a sequence of object keys from the record's top level down.

``from = "customer.id"`` is the key "id" of the object under "customer"; a key of any
spelling is written as it is (``orderId``), and a key holding a dot or a backtick in
backticks, a backtick doubled (```a.b`.c``). Without ``from`` the path is the column's name.
A path that is absent, or runs through a null, is a missing value (NULL, or a dead letter
for a ``not null`` column); one that runs through something other than an object is a
wrong type, named by the part of the path that is not an object. Plain Python, pure: the
config validates paths with it, the formats read records with it.
"""

from __future__ import annotations

from collections.abc import Sequence

Path = tuple[str, ...]


class BadPath(ValueError):
    """A ``from`` that is not a path; the message says why."""


class NotAnObject(ValueError):
    """A path runs through a value that is not an object: ``where`` is that part."""

    def __init__(self, where: Path, value):
        super().__init__(label(where))
        self.where = where
        self.value = value


def parse(text: str) -> Path:
    """``customer.id`` -> ("customer", "id"); raises BadPath."""
    if not isinstance(text, str):
        raise BadPath("is not a string: write a key, or keys separated by dots (customer.id)")
    if not text:
        raise BadPath("is empty: write a key, or keys separated by dots (customer.id)")
    keys: list[str] = []
    i, n = 0, len(text)
    while True:
        if i < n and text[i] == "`":  # a quoted key: up to the next lone backtick
            key, i = [], i + 1
            while True:
                j = text.find("`", i)
                if j < 0:
                    raise BadPath("has a backtick that is not closed")
                key.append(text[i:j])
                if text[j + 1:j + 2] == "`":  # a doubled backtick is one backtick
                    key.append("`")
                    i = j + 2
                    continue
                i = j + 1
                break
            keys.append("".join(key))
        else:
            j = text.find(".", i)
            j = n if j < 0 else j
            key = text[i:j]
            if "`" in key:
                raise BadPath("has a backtick inside a key: quote the whole key (`a.b`)")
            if not key:
                raise BadPath("has an empty key (two dots, or a dot at either end)")
            keys.append(key)
            i = j
        if i == n:
            return tuple(keys)
        if text[i] != ".":
            raise BadPath("has text after a quoted key: separate keys with dots")
        i += 1
        if i == n:
            raise BadPath("has an empty key (two dots, or a dot at either end)")


def label(path: Sequence[str]) -> str:
    """A path as the config spells it: customer.id (quoted where needed)."""
    return ".".join(k if k and "." not in k and "`" not in k
                    else "`" + k.replace("`", "``") + "`" for k in path)


def field(name: str, path: Sequence[str]) -> str:
    """A column's field in a dead letter's message: its path, and its column if renamed."""
    if tuple(path) == (name,):
        return f"'{name}'"
    return f"'{label(path)}' (column {name})"


def lookup(doc: dict, path: Sequence[str]):
    """The value at ``path`` in ``doc``, or None when a key is absent or a value on the
    way is null; raises NotAnObject when a value on the way is not an object (dict)."""
    x = doc
    for i, key in enumerate(path):
        if type(x) is not dict:
            raise NotAnObject(tuple(path[:i]), x)
        x = x.get(key)
        if x is None:
            return None
    return x


def holds_key(doc: dict, path: Sequence[str]) -> bool:
    """Whether the object the path's last key belongs to has that key (its value null)."""
    try:
        parent = lookup(doc, path[:-1]) if len(path) > 1 else doc
    except NotAnObject:
        return False
    return type(parent) is dict and path[-1] in parent


def columns(declared: Sequence[Sequence]) -> list[tuple[str, str, bool, Path]]:
    """(name, type, required, path) of declared columns given as (name, type, required)
    or (name, type, required, path); an empty or absent path is the column's name."""
    out = []
    for c in declared:
        name, type_, required = c[0], c[1], c[2]
        path = tuple(c[3]) if len(c) > 3 and c[3] else (name,)
        out.append((name, type_, required, path))
    return out
