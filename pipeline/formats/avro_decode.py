"""The avro format's decode of a flat record in generated Python, for the batch loop
(avro_rows.py): fastavro calls a Python file object once per varint byte (16 calls for a
21-byte order), and slicing the value's own bytes in generated code is faster (1.5 against
2.1 us for a bench order, docs/benchmarks.md "Avro records"; its varints unrolled, and
no null test where the field cannot be null: less again).

Only the simplest writer schemas, and only their usual bytes: a record whose fields are
all null, boolean, int, long, float, double, bytes or string, or a union of null and one of
them, with no logical type left (avro_raw.py strips the ones columns take raw). A varint of
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


def decoder(schema) -> tuple[list[str], dict[str, str], dict[str, str]] | None:
    """(source lines decoding the value v (from p = 5 to end = len(v)) into locals, the
    local of each field by name, the kind of each field that is never null by name), or
    None when the writer schema (fastavro's parsed form) is not a flat record of the kinds
    above. A never-null int or long is an int of at most 63 bits and zigzag: always in a
    long's range; a string a str."""
    if type(schema) is not dict or schema.get("type") != "record":
        return None
    lines: list[str] = []
    names: dict[str, str] = {}
    kinds: dict[str, str] = {}
    for j, f in enumerate(schema.get("fields", ())):
        dst, t = f"v{j}", f.get("type")
        if f.get("name") in names:
            return None
        kind = _primitive(t)
        if kind is not None:
            lines += _read(kind, dst)
            if kind != "null":
                kinds[f["name"]] = kind
        elif type(t) is list and len(t) == 2 and "null" in t:
            null_at = t.index("null")
            other = _primitive(t[1 - null_at])
            if other is None or other == "null":
                return None
            branch = [f"    {line}" for line in _read(other, dst)]
            lines += [*_VARINT.splitlines(), f"if n == {2 * null_at}:", f"    {dst} = None",
                      f"elif n == {2 * (1 - null_at)}:", *branch, "else:", "    raise W"]
        else:
            return None
        names[f["name"]] = dst
    return lines + ["if p != end: raise W"], names, kinds
