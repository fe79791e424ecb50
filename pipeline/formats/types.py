"""The declared column types of ``[sink.columns]``, in one registry: for each, its Spark SQL
type, its Postgres type, the JSON and Avro formats' rules for a value of it and the row
encoder's inlined form of the JSON rule.

settings/columns.py validates declarations against it, store/tables.py builds the SQLAlchemy
types from its Postgres types, spark/transform.py takes its Spark types, a transform's
writer (executor/transform/arrow_copy.py) how each Postgres type is written as COPY text,
json/rows.py its inlined checks. A new
column type is one entry here (and a new format's value rule, a new field). Plain Python:
the executors import it without SQLAlchemy or Spark. ``decimal(p,s)`` and ``array<T>`` (a
Postgres T[] of a scalar type; jsonb and arrays: documents.py) are parsed here only.
``decimal`` (a NUMERIC without precision) is exact: each value keeps its own digits and
scale.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache

from pipeline.formats import documents as doc
from pipeline.formats.avro import values as av
from pipeline.formats.json import values as jv
from pipeline.formats.json.diagnose import json_kind


@dataclass(frozen=True)
class ColumnType:
    declared: str  # as in the config, without " not null": 'long', 'decimal(12,2)'
    spark: str  # Spark SQL's type (from_json's schema on the transform path)
    pg: str  # Postgres's type, as DDL spells it (store.tables.ddl_type)
    from_json: Callable  # a parsed JSON value -> its COPY text field; raises WrongType
    from_avro: Callable  # a value fastavro decoded -> its COPY text field; raises WrongType
    # The row encoder's inlined from_json (json/rows.py): lines that leave x's COPY text
    # in f{i} or raise; () = call from_json.
    inline: tuple[str, ...] = ()
    sum: str | None = None  # the declared type of sum(column); None: not a number
    precision: int | None = None  # of a decimal
    scale: int | None = None
    element: ColumnType | None = None  # of an array

    @property
    def scalar(self) -> bool:
        """One value (not jsonb, not an array): a key, a group, a min or max."""
        return self.element is None and self.pg != "jsonb"

    @property
    def is_decimal(self) -> bool:
        """decimal(p,s) or decimal: a Postgres numeric."""
        return self.precision is not None or self.pg == "numeric"

    @property
    def own_scale(self) -> bool:
        """A decimal without precision (or an array of them): each value keeps its scale."""
        if self.element is not None:
            return self.element.own_scale
        return self.pg == "numeric"

    @property
    def exact_json(self) -> bool:
        """A decimal wider than a double's 15 exact digits, or without precision (or an
        array of them), or jsonb (its numbers are kept as written): its JSON is parsed
        exactly."""
        if self.element is not None:
            return self.element.exact_json
        return (self.pg in ("jsonb", "numeric")
                or (self.precision is not None and self.precision > 15))


def _integer_check(bits: int) -> tuple[str, ...]:
    lo, hi = -(1 << (bits - 1)), 1 << (bits - 1)
    return (f"if type(x) is not int or not {lo} <= x < {hi}: raise W", "f{i} = x")


TYPES: dict[str, ColumnType] = {t.declared: t for t in (
    ColumnType("string", "string", "text", jv.string, av.string, (
        "if type(x) is not str: raise W",
        # isalnum(): nothing to escape and no NUL, checked in C; otherwise text() decides.
        "f{i} = x if x.isalnum() else text(x)")),
    ColumnType("long", "bigint", "bigint", jv.integer(64), av.integer(64), _integer_check(64),
               sum="long"),
    ColumnType("int", "int", "integer", jv.integer(32), av.integer(32), _integer_check(32),
               sum="long"),
    ColumnType("double", "double", "double precision", jv.double, av.double, sum="double"),
    ColumnType("boolean", "boolean", "boolean", jv.boolean, av.boolean, (
        "f{i} = 't' if x is True else 'f' if x is False else c{i}(x)",)),
    ColumnType("timestamp", "timestamp", "timestamp with time zone", jv.timestamp,
               av.timestamp, (
        # The usual shape is validated here and passed as written; others go to from_json.
        "if type(x) is str and shape(x) is not None:",
        "    fromiso(x)",
        "    f{i} = x",
        "else:",
        "    f{i} = c{i}(x)")),
    ColumnType("date", "date", "date", jv.date_, av.date_),
    # A NUMERIC without precision: every value exact, with its own scale (json/values.py).
    # No Spark type holds that: refused under a transform (settings/sink.py).
    ColumnType("decimal", "string", "numeric", jv.exact_decimal, av.exact_decimal,
               sum="decimal"),
    # A sub-document kept whole (documents.py); Spark's from_json keeps any value's text.
    ColumnType("jsonb", "string", "jsonb", doc.jsonb, doc.jsonb),
)}
SCALARS = [t for t in TYPES if TYPES[t].scalar]

_DECIMAL = r"decimal\((\d{1,2}),(\d{1,2})\)"
_ARRAY = r"array<(?:" + "|".join(SCALARS) + r"|decimal\(\d{1,2},\d{1,2}\))>"
# A declared type (config.COLUMN_TYPE): group 1 the type, 2 and 3 a decimal's p and s.
DECLARED = "(" + "|".join([*TYPES, _DECIMAL, _ARRAY]) + ")"
SPELLED = (", ".join(SCALARS) + ", decimal(p,s), jsonb or array<T> (T one of these but "
           "jsonb)")  # for error messages


@cache
def decimal(precision: int, scale: int) -> ColumnType:
    if precision > 15:  # parsed as Decimal (json/format.loader): the exact path
        inline: tuple[str, ...] = ()
    else:
        # A float or int well inside the precision (no rounding can overflow it) is passed
        # as Python writes it; Postgres rounds it half away from zero, as ROUND_HALF_UP does.
        bound = 10 ** (precision - scale) - 1
        inline = ("t = type(x)",
                  f"f{{i}} = x if (t is float or t is int) and -{bound} < x < {bound} "
                  "else c{i}(x)")
    declared = f"decimal({precision},{scale})"
    return ColumnType(declared, declared, f"numeric({precision},{scale})",
                      jv.decimal(precision, scale), av.decimal(precision, scale), inline,
                      sum=f"decimal(38,{scale})",
                      precision=precision, scale=scale)  # a sum outgrows p


@cache
def array(element: ColumnType) -> ColumnType:
    """array<T>: a Postgres array of T; its values by T's rules, element by element."""
    return ColumnType(
        f"array<{element.declared}>", f"array<{element.spark}>", f"{element.pg}[]",
        doc.array(element.from_json, doc.json_string if element.declared == "string"
                  else None, json_kind),
        doc.array(element.from_avro, doc.avro_string if element.declared == "string"
                  else None, av.avro_kind),
        element=element)


def column_type(declared: str) -> ColumnType:
    """The registry's entry of a declared type (config.Column.type); KeyError if unknown."""
    t = TYPES.get(declared)
    if t is not None:
        return t
    if declared.startswith("array<") and declared.endswith(">"):
        inner = column_type(declared[6:-1])
        if not inner.scalar:
            raise KeyError(f"unknown column type {declared!r}; an array's elements are one "
                           f"of {', '.join(SCALARS)} or decimal(p,s)")
        return array(inner)
    m = re.fullmatch(_DECIMAL, declared)
    if m is None:
        raise KeyError(f"unknown column type {declared!r}; use {SPELLED}")
    return decimal(int(m.group(1)), int(m.group(2)))


# How a value of a Postgres type is written as COPY text from Arrow
# (executor/transform/arrow_copy.py), for the declared types and the fixed columns
# (coordinates, raw records, dead letters).
HEX, TIMESTAMP, ESCAPED, PLAIN = "hex", "timestamp", "escaped", "plain"
_COPY_FORMS = {"bytea": HEX, "timestamptz": TIMESTAMP, "timestamp with time zone": TIMESTAMP,
               "text": ESCAPED, "jsonb": ESCAPED}


def copy_form(pg_type: str) -> str:
    """HEX (bytea's \\x input), TIMESTAMP (with an explicit UTC offset), ESCAPED (text:
    backslash, tab, newline, carriage return) or PLAIN (numbers, booleans, dates: their
    string form is COPY-safe already)."""
    base = pg_type.replace(" NOT NULL", "").strip().lower()
    return _COPY_FORMS.get(base, ESCAPED if base.startswith("text") else PLAIN)
