"""The avro format's hot loop: a batch loop generated per writer schema, like the JSON
format's row encoder (json/rows.py).

The per-record steps of AvroFormat.rows (a closure per value, a loop over the columns with a
function call per field, the Kafka timestamp's method call) cost twice fastavro's decode
(docs/benchmarks.md, "Avro records"), so for one writer schema the decode, its checks and
the declared columns' conversions are unrolled into the source of one function. It only
ever takes a record the general path would take, with the same text: it decodes the
record's own bytes (a plain record by generated code, avro/decode.py, which takes only what
fastavro reads to the same values; any other with fastavro from the batch's buffer, the
decode ending exactly where the record's bytes end), and converts each column with the
column's own converter (or an inlined copy of it: a range check, a text that needs no
escaping, the raw decimal and timestamp of avro/raw.py). Anything else (a schema id not
met, an error, a null in a required column) goes to the general path, alone, which says why.
A value of another writer schema in the batch (producers mid-rollout) goes through that
writer's generated one-record encoder (record_encoder), the same steps for one value.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Callable, Sequence

from pipeline.formats import binary_fields, paths
from pipeline.formats.avro import raw
from pipeline.formats.avro.decode import decoder
from pipeline.formats.json.values import WrongType
from pipeline.formats.refused import Refused
from pipeline.formats.types import column_type
from pipeline.formats.wire.binary import NULL_FIELD, pack_i, pack_iq
from pipeline.formats.wire.text import NULL, text


def _convert(i: int, declared: str, convert: Callable, kind: str | None = None,
             loop: bool = False) -> list[str]:
    """Column i's conversion of a non-null x into f{i} (its text, or an int whose str() is
    it), or a raise; c{i} is the column's converter, whose result is the general path's.
    ``kind``: the field's Avro kind when the generated decode read it (avro/decode.py),
    so x's type is known: a long's is an int in a long's range, a string's a str.
    ``loop``: in batch_encoder's loop, where a timestamp column keeps the day of its last
    value (a batch's times mostly share their day: no divmod, no lookup)."""
    raw = getattr(convert, "raw", None)
    if raw is None and declared == "long" and kind in ("int", "long"):
        return [f"f{i} = x"]
    if raw is None and declared == "string" and kind == "string":
        return [f"f{i} = x if x.isalnum() else text(x)"]
    if raw == "decimal":
        # The unscaled integer with the scale as an exponent, as avro/raw._decimal writes
        # it; two's complement by hand (int.from_bytes with keywords costs twice the call
        # without; an empty x raises here: the general path reads it).
        bound, point = 10 ** convert.precision, f"e-{convert.scale}" if convert.scale else ""
        return ["if x[0] < 128:", "    un = FB(x)", f"    if un >= {bound}: raise W",
                "else:", "    un = FB(x) - (1 << (len(x) << 3))",
                f"    if un <= -{bound}: raise W", f"f{i} = f'{{un}}{point}'"]
    if raw == "timestamp":
        scaled = [] if convert.unit == 1 else [f"x = x * {convert.unit}"]
        if loop:  # the day of the column's last value (lo{i}: its first microsecond)
            return [*scaled, f"us = x - lo{i}", "if 0 <= us < 86400000000:", f"    d = dt{i}",
                    "else:", "    day, us = divmod(x, 86400000000)",
                    "    d = days.get(day)", "    if d is None: d = day_text(day)",
                    f"    lo{i} = x - us", f"    dt{i} = d",
                    *_time_of_day(i)]
        return [*scaled, "day, us = divmod(x, 86400000000)",
                "d = days.get(day)",
                "if d is None: d = day_text(day)",
                *_time_of_day(i)]
    if raw == "date":
        return [f"f{i} = days.get(x)", f"if f{i} is None: f{i} = day_text(x)"]
    if raw is None and declared == "string":
        return [f"f{i} = (x if x.isalnum() else text(x)) if type(x) is str else c{i}(x)"]
    if raw is None and declared in ("long", "int"):
        return [line.format(i=i) for line in column_type(declared).inline]  # f{i} = x
    return [f"f{i} = c{i}(x)"]


def _time_of_day(i: int) -> list[str]:
    """f{i}: a timestamp's text from its day's text d and its microsecond of the day us."""
    # // and % rather than divmod: no call, no tuple (0.38 against 0.48 us a timestamp).
    return ["s = us // 1000000", "us %= 1000000",
            "t = times.get(s)",
            "if t is None: t = time_text(s)",
            f"f{i} = f'{{d}} {{t}}.{{us:06d}}+00:00' if us else f'{{d}} {{t}}+00:00'"]


def _binary(i: int, declared: str, convert: Callable, kind: str | None = None) -> list[str]:
    """Column i's conversion of a non-null x into f{i}, its COPY binary field
    (binary_fields.py), or a raise: the same checks as _convert's text, so the same
    records are taken. A timestamp or date is one subtraction and a pack (the text's
    range: years 1-9999), a decimal numeric's own form (N{i}); a type without a lines of
    its own here converts _convert's text (B{i}: binary_fields.from_text)."""
    raw = getattr(convert, "raw", None)
    if raw is None and declared == "long" and kind in ("int", "long"):
        return [f"f{i} = IQ(8, x)"]
    if raw is None and declared == "string" and kind == "string":
        # NUL: text() refuses it (Unstorable); the general path says so.
        return ["if '\\x00' in x: raise W", "b = x.encode()", f"f{i} = PI(len(b)) + b"]
    if raw == "decimal":
        if convert.scale > 4:
            return [*_convert(i, declared, convert, kind)[:-1], f"f{i} = N{i}(un)"]
        # binary_fields.numeric_of's usual cases inline (no call): the value in units of
        # 10**-4 as two or three base-10000 digits, the sign from the two's complement.
        bound, mul, scale = 10 ** convert.precision, 10 ** (4 - convert.scale), convert.scale
        return ["if x[0] < 128:", "    un = FB(x)", f"    if un >= {bound}: raise W",
                f"    sg, n = 0, un * {mul}",
                "else:", "    un = FB(x) - (1 << (len(x) << 3))",
                f"    if un <= -{bound}: raise W", f"    sg, n = 16384, -un * {mul}",
                f"if n < 100000000: f{i} = D2(12, 2, 0, sg, {scale}, n // 10000, n % 10000)",
                f"elif n < 1000000000000: f{i} = D3(14, 3, 1, sg, {scale}, n // 100000000, "
                "n // 10000 % 10000, n % 10000)",
                f"else: f{i} = N{i}(un)"]
    if raw == "timestamp":
        scaled = [] if convert.unit == 1 else [f"x = x * {convert.unit}"]
        return [*scaled, f"if not {binary_fields.FIRST_US} <= x < {binary_fields.END_US}: "
                "raise W", f"f{i} = IQ(8, x - {binary_fields.PG_EPOCH_US})"]
    if raw == "date":
        return [f"if not {binary_fields.FIRST_DAY} <= x < {binary_fields.END_DAY}: raise W",
                f"f{i} = II(4, x - {binary_fields.PG_EPOCH_DAY})"]
    return [*_convert(i, declared, convert, kind), f"f{i} = B{i}(f{i})"]


def reads_values(columns: Sequence[tuple], schema) -> bool:
    """True when batch_encoder's loop decodes each value from its own bytes (the generated
    decode), so the batch needs no shared buffer."""
    return decoder(schema, [tuple(c[1]) for c in columns]) is not None


def _body(columns: Sequence[tuple], schema, loop: bool = False,
          binary: bool = False) -> tuple[tuple | None, list[str]]:
    """(the generated decode of a flat writer or None, the lines converting the decoded
    record (``doc``, or the flat decode's locals) into f0, f1...: COPY text fields, or
    with ``binary`` COPY binary ones)."""
    flat = decoder(schema, [tuple(c[1]) for c in columns])
    body = []
    for i, (key, path, convert, required, declared, _) in enumerate(columns):
        kind = None
        if flat is not None:
            body.append(f"x = {flat[1].get(tuple(path), 'None')}")
            kind = flat[2].get(tuple(path))  # a field never null: no null test
        else:
            body.append(f"x = doc.get({key!r})" if key is not None else
                        f"x = lookup(doc, {tuple(path)!r})")
        convert_lines = (_binary(i, declared, convert, kind) if binary else
                         _convert(i, declared, convert, kind, loop))
        if kind is not None:
            body += convert_lines
            continue
        body += (["if x is None: raise W", *convert_lines] if required else
                 ["if x is None:", f"    f{i} = {'NF' if binary else 'NULL'}", "else:",
                  *("    " + line for line in convert_lines)])
    return flat, body


def _namespace(schema, columns: Sequence[tuple] = (), binary: bool = False) -> dict:
    from fastavro import schemaless_reader

    extra = {}
    if binary:  # each column's numeric packer and text -> binary converter (_binary)
        extra = {"NF": NULL_FIELD, "IQ": pack_iq, "II": binary_fields.pack_ii, "PI": pack_i,
                 "D2": binary_fields.NUMERIC[2], "D3": binary_fields.NUMERIC[3]}
        for i, c in enumerate(columns):
            if getattr(c[2], "raw", None) == "decimal":
                extra[f"N{i}"] = binary_fields.numeric_of(c[2].scale)
            extra[f"B{i}"] = binary_fields.from_text(c[4])
    return {**extra, "NULL": NULL, "W": WrongType, "FB": int.from_bytes, "text": text,
            "lookup": paths.lookup, "Refused": Refused, "days": raw.DAYS,
            "day_text": raw.day_text, "times": raw.TIMES,
            "time_text": raw.time_text, "f32": struct.Struct("<f").unpack_from,
            "f64": struct.Struct("<d").unpack_from, "BytesIO": io.BytesIO,
            "read": schemaless_reader, "schema": schema}


def record_encoder(columns: Sequence[tuple], schema, binary: bool = False) -> Callable:
    """A function (c0..., value) -> the COPY text fields (``binary``: the COPY binary
    fields) of one value of this writer
    schema, or a raise: the loop's own steps for a record of another writer in a batch
    (batch_encoder's loop is its first writer's). It decodes the value's own bytes (a
    flat writer by the generated decode, any other by fastavro from a buffer of its own)
    and takes only what the loop would; anything else raises, and the record goes to the
    general path, which says why."""
    flat, body = _body(columns, schema, binary=binary)
    if flat is None:
        decode = ["fo = BytesIO(value)", "fo.seek(5)", "doc = read(fo, schema, None)",
                  "if fo.tell() != len(value) or type(doc) is not dict: raise W"]
    else:
        decode = ["v = value", "end = len(v)", "p = 5", *flat[0]]
    params = "".join(f"c{i}, " for i in range(len(columns)))
    source = (f"def encode_one({params}value):\n"
              + "".join(f"    {line}\n" for line in [*decode, *body,
                                                     f"return {_fields(columns, binary)}"]))
    namespace = _namespace(schema, columns, binary)
    how = "generated decode" if flat is not None else "fastavro"
    exec(compile(source, f"<avro record_encoder {[c[5] for c in columns]}, {how}>", "exec"),
         namespace)
    return namespace["encode_one"]


def _names(columns: Sequence[tuple]) -> str:
    """'f0, f1, ...' of the columns, for a tuple's items."""
    return "".join(f"f{i}, " for i in range(len(columns)))


def _fields(columns: Sequence[tuple], binary: bool) -> str:
    """The expression of a row's fields f0, f1...: text joined by tabs, or bytes."""
    if binary:
        return f"b''.join(({_names(columns)}))"
    return 'f"' + "\\t".join(f"{{f{i}}}" for i in range(len(columns))) + '"'


def batch_encoder(columns: Sequence[tuple], schema=None, binary: bool = False) -> Callable:
    """A function (records, head, tail, header, fo, read, schema, general, ts, rejected,
    refuse, ones, c0...) -> result rows for the values of one writer schema (``header``: its
    5 bytes); ``columns``: AvroFormat.columns (with raw converters where the writer has
    them). Rows are COPY text lines, or with ``binary`` COPY binary tuples (``head``,
    ``tail``, ``ts`` and what ``general`` and ``ones`` return are then bytes too:
    binary_fields.py). ``general(value, start)``: the general path's fields of a value at
    ``start`` in ``fo``, raising Refused. ``schema``: the parsed schema it decodes with;
    a plain record (avro/decode.py: flat, or records the columns' paths reach into) is
    decoded by generated code,
    from the value's own bytes (``fo`` None, ``start`` 0: see ``reads_values``), any
    other by fastavro from ``fo``. ``ones``: header -> the record_encoder of another
    writer (its converters bound), for the batch's values of other writers."""
    params = [f"c{i}" for i in range(len(columns))]
    flat, body = _body(columns, schema, loop=True, binary=binary)
    # No day yet: lo{i} so far below any timestamp that no value is in its day.
    days_seen = "".join(f"    lo{i}, dt{i} = -(1 << 70), None\n" for i, c in enumerate(columns)
                        if getattr(c[2], "raw", None) == "timestamp" and not binary)
    # The row written in one expression, as the general path's below.
    if binary:
        row = f"b''.join((head, IQ(8, m.offset()), kts, {_names(columns)}tail))"
        line_row = "b''.join((head, IQ(8, m.offset()), kts, line, tail))"
    else:
        fields = "\\t".join(f"{{f{i}}}" for i in range(len(columns)))
        row = f'f"{{head}}{{m.offset()}}\\t{{kts}}\\t{fields}{{tail}}"'
        line_row = 'f"{head}{m.offset()}\\t{kts}\\t{line}{tail}"'
    row_lines = ["ms = m.timestamp()[1]", "kts = seen.get(ms)", "if kts is None:",
                 "    kts = ts(ms)", f"append({row})", "continue"]
    if flat is None:
        decode = ["seek(start + 5)", "doc = read(fo, schema, None)",
                  "if tell() != at or type(doc) is not dict: raise W", *body, *row_lines]
    else:
        decode = ["v = value", "end = len(v)", "p = 5", *flat[0], *body, *row_lines]
    inner = "\n".join("                " + b for b in decode)
    # fastavro reads from the batch's buffer, where a value starts at ``start``; the
    # generated decode reads the value itself, and general() decodes it alone.
    shared = ("    seek, tell = fo.seek, fo.tell\n    at = 0\n" if flat is None else "")
    where = ("        start = at\n        at += len(value)\n" if flat is None else
             "        start = 0\n")
    source = f"""
def encode_rows(records, head, tail, header, fo, read, schema, general, ts, rejected, refuse,
                ones, {', '.join(params + [''])}):
    rows = []
    append = rows.append
{shared}{days_seen}    seen = ts.cache
    for m in records:
        value = m.value()
        if value is None:
            rejected.append(m)
            continue
{where}        if value.startswith(header):
            try:
{inner}
            except Exception:
                pass
        else:
            one = ones.get(value[:5])
            if one is not None:
                try:
                    line = one(value)
                    ms = m.timestamp()[1]
                    kts = seen.get(ms)
                    if kts is None:
                        kts = ts(ms)
                    append({line_row})
                    continue
                except Exception:
                    pass
        try:
            line = general(value, start)
        except Refused as e:
            refuse(m, e.error_type, e.message)
            continue
        ms = m.timestamp()[1]
        kts = seen.get(ms)
        if kts is None:
            kts = ts(ms)
        append({line_row})
    return rows
"""
    namespace = _namespace(schema, columns, binary)
    how = "generated decode" if flat is not None else "fastavro"
    exec(compile(source, f"<avro batch_encoder {[c[5] for c in columns]}, {how}>", "exec"),
         namespace)
    return namespace["encode_rows"]
