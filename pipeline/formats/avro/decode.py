"""The avro format's decode of a plain record in generated Python, for the batch loop
(avro/rows.py): fastavro calls a Python file object once per varint byte (16 calls for a
21-byte order), and slicing the value's own bytes in generated code is faster (1.5 against
2.1 us for a bench order, docs/benchmarks.md "Avro records"; its varints unrolled, and
no null test where the field cannot be null: less again).

Only the simplest writer schemas, and only their usual bytes: a record whose fields are
all null, boolean, int, long, float, double, bytes, string or an enum, a record of such
fields, or a union of null and one of them, with no logical type left (avro/raw.py strips the ones
columns take raw), and whose columns' paths each reach such a field or a field the writer
lacks (not through a plain field, not to a whole record). A varint of
at most 9 bytes, a union branch 0 or 1, a length that fits in the value, valid UTF-8, and
the decode ending exactly at the value's end; anything else raises, and the loop hands the
record to the general path, where fastavro decodes it and says why. So every record this
code takes is one fastavro reads to the same values, from the same bytes.
"""

from __future__ import annotations

PRIMITIVES = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


def _varint(depth: int = 0) -> list[str]:
    """Lines reading a varint at p of v into n, unrolled (no loop, no shift counter: a
    bench order's timestamp is 8 bytes); exactly the loop fastavro's reads agree with: at
    most 9 bytes (the 9th must end it), an IndexError past the value's end."""
    if depth == 0:
        return ["b = v[p]", "if b < 128:", "    n = b", "    p += 1", "else:",
                *("    " + line for line in ["n = b & 127", *_varint(1)])]
    if depth == 9:
        return ["raise W"]
    shift = 7 * depth
    return [f"b = v[p + {depth}]", "if b < 128:", f"    n |= b << {shift}",
            f"    p += {depth + 1}", "else:",
            *("    " + line for line in [f"n |= (b & 127) << {shift}", *_varint(depth + 1)])]


_VARINT = "\n".join(_varint()) + "\n"


def _primitive(t) -> str | None:
    if type(t) is str:
        return t if t in PRIMITIVES else None
    if type(t) is dict and "logicalType" not in t and t.get("type") in PRIMITIVES:
        return t["type"]
    return None


def _enum(t) -> tuple | None:
    """The symbols of an enum type (fastavro's parsed form), or None."""
    if type(t) is dict and t.get("type") == "enum" and "logicalType" not in t:
        symbols = t.get("symbols")
        if type(symbols) is list and all(type(x) is str for x in symbols):
            return tuple(symbols)
    return None


def _read_enum(symbols: tuple, dst: str) -> list[str]:
    """An enum's symbol by its index; a negative or too large index raises (fastavro's
    reading of it, whatever it is, is the general path's)."""
    return [*_VARINT.splitlines(), "n = (n >> 1) ^ -(n & 1)", "if n < 0: raise W",
            f"{dst} = {symbols!r}[n]"]


def _read(kind: str, dst: str) -> list[str]:
    """Lines reading one value of a primitive ``kind`` at p of v into ``dst``."""
    if kind == "null":
        return [f"{dst} = None"]
    if kind == "boolean":
        return [f"{dst} = v[p] != 0", "p += 1"]
    if kind in ("int", "long"):
        return [*_VARINT.splitlines(), f"{dst} = (n >> 1) ^ -(n & 1)"]
    if kind in ("float", "double"):
        size, unpack = (4, "f32") if kind == "float" else (8, "f64")
        return [f"if p + {size} > end: raise W", f"{dst} = {unpack}(v, p)[0]",
                f"p += {size}"]
    # bytes, string: a length, then that many bytes
    take = "v[p:q].decode()" if kind == "string" else "v[p:q]"
    return [*_VARINT.splitlines(), "q = p + ((n >> 1) ^ -(n & 1))",
            "if q < p or q > end: raise W", f"{dst} = {take}", "p = q"]


def _record(record, prefix: tuple, nullable: bool, out: dict) -> list[str] | None:
    """Lines decoding the fields of ``record`` (fastavro's parsed form) into locals,
    noting in ``out`` each field's local ("leaves": path -> local), kind where never null
    ("kinds") and the paths of records ("records"); None when a field is of a kind not
    taken here."""
    if type(record) is not dict or record.get("type") != "record":
        return None
    lines: list[str] = []
    seen = set()
    for f in record.get("fields", ()):
        name, t = f.get("name"), f.get("type")
        if name in seen:
            return None
        seen.add(name)
        path = (*prefix, name)
        dst = f"v{len(out['leaves']) + len(out['records'])}"
        kind = _primitive(t)
        nested = None
        if kind is None and type(t) is list and len(t) == 2 and "null" in t:
            null_at = t.index("null")
            other = t[1 - null_at]
            kind = _primitive(other)
            if kind is None and _enum(other) is not None:
                out["leaves"][path] = dst
                branch = _read_enum(_enum(other), dst)
                inner = [f"{dst} = None"]
            elif kind is None:  # [null, record]: its fields all null in the null branch
                before = set(out["leaves"])
                nested = _record(other, path, True, out)
                if nested is None:
                    return None
                out["records"].add(path)
                inner = [f"{out['leaves'][k]} = None" for k in out["leaves"] if k not in before]
                branch = nested
            elif kind == "null":
                return None
            else:
                out["leaves"][path] = dst
                branch = _read(kind, dst)
                inner = [f"{dst} = None"]
            lines += [*_VARINT.splitlines(), f"if n == {2 * null_at}:",
                      *(f"    {line}" for line in inner or ["pass"]),
                      f"elif n == {2 * (1 - null_at)}:",
                      *(f"    {line}" for line in branch or ["pass"]), "else:", "    raise W"]
        elif kind is not None:
            out["leaves"][path] = dst
            lines += _read(kind, dst)
            if kind != "null" and not nullable:
                out["kinds"][path] = kind
        elif _enum(t) is not None:  # its symbol: a str
            out["leaves"][path] = dst
            lines += _read_enum(_enum(t), dst)
            if not nullable:
                out["kinds"][path] = "string"
        else:  # a record: its fields in line
            nested = _record(t, path, nullable, out)
            if nested is None:
                return None
            out["records"].add(path)
            lines += nested
    return lines


def decoder(schema, paths=None) -> tuple[list[str], dict[tuple, str], dict[tuple, str]] | None:
    """(source lines decoding the value v (from p = 5 to end = len(v)) into locals, the
    local of each column's field by its path, the kind of each such field that is never
    null), or None when the writer schema (fastavro's parsed form) is not a record of
    the kinds above (fields null, boolean, int, long, float, double, bytes, string, an
    enum, a record of such fields, or a union of null and one of them), or a column's path
    reaches anything but such a field or a field the writer does not have (through a
    primitive, or to a whole record: fastavro and the general rules then). ``paths``:
    the columns' paths (tuples); None: every top-level field by its name. A never-null
    int or long is an int of at most 63 bits and zigzag: always in a long's range; a
    string a str."""
    out: dict = {"leaves": {}, "kinds": {}, "records": set()}
    lines = _record(schema, (), False, out)
    if lines is None:
        return None
    leaves, records = out["leaves"], out["records"]
    for path in paths or ():
        if path in records:
            return None
        for i in range(1, len(path)):
            if path[:i] in leaves:  # through a primitive: NotAnObject, or a null
                return None
    if paths is None:  # top-level names, as before
        return (lines + ["if p != end: raise W"], {k[0]: v for k, v in leaves.items()
                                                   if len(k) == 1},
                {k[0]: v for k, v in out["kinds"].items() if len(k) == 1})
    return lines + ["if p != end: raise W"], leaves, out["kinds"]
