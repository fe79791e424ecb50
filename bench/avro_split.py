"""Where the avro sink's encoding CPU per record goes (issue 26): the generated batch loop
(formats/avro_rows.py) for the bench orders, whole and with parts of its source replaced
by constants (a conversion's text, the decode of the wire bytes, both), against the json
sink on the same orders; N orders in one process, batches of 10,000, alternated rounds,
medians of time.process_time per record. The replacements follow the generated text of
the bench's four columns: a change of the generator can make them fail (ValueError).

    .venv/bin/python -m bench.avro_split [N] [ROUNDS]
"""

from __future__ import annotations

import json
import sys
import tempfile

from bench.avro_encoder import _message, report, us_per_record, wire_orders
from bench.avro_orders import SCHEMA
from pipeline.formats import avro_rows
from pipeline.formats.avro_schemas import SchemaSource
from pipeline.sample import order

_IN = " " * 16  # the loop body's indent


def _between(src: str, start: str, end: str, repl: str) -> str:
    i = src.index(_IN + start + "\n")
    return src[:i] + _IN + repl + "\n" + src[src.index(_IN + end, i):]


EDITS = {
    "whole loop": [],
    "no decimal text": [("x = v2", "x = v3", "f2 = 'x'")],
    "no timestamp text": [("x = v3", "ms = m.timestamp", "f3 = 'x'")],
    "no string text": [("x = v1", "x = v2", "f1 = 'x'")],
    "no conversions": [("x = v0", "ms = m.timestamp", "f0 = f1 = f2 = f3 = 'x'")],
    "no decode (values as constants)": [
        ("v = value", "x = v0", "v0, v1, v2, v3 = 5, 'c5', b'\\x02q', 1767225900000000")],
}
EDITS["neither"] = EDITS["no decode (values as constants)"] + EDITS["no conversions"]


def main(argv: list[str]) -> int:
    n = int(argv[0]) if argv else 100_000
    rounds = int(argv[1]) if len(argv) > 1 else 5
    avro = wire_orders(n)
    js = [_message(i, order(i)) for i in range(n)]
    real = compile
    edit: list = []
    applied: list[str] = []  # the variants whose edits compiled (a failed edit: no loop)

    def compiled(src, name, mode, *a, **k):  # the batch loop's source, edited
        if "avro batch" in name:
            for start, end, repl in edit:
                src = _between(src, start, end, repl)
            applied.append(name)
        return real(src, name, mode, *a, **k)

    avro_rows.compile = compiled
    with tempfile.TemporaryDirectory() as tmp:
        with open(f"{tmp}/1.avsc", "w") as f:
            f.write(json.dumps(SCHEMA))
        schemas = SchemaSource(schemas_dir=tmp)

        def us(fmt: str, records: list) -> float:
            return us_per_record(fmt, records, schemas if fmt == "avro" else None)

        got: dict[str, list[float]] = {k: [] for k in [*EDITS, "json sink"]}
        for _ in range(rounds):
            for k, e in EDITS.items():
                edit[:], applied[:] = e, []
                got[k].append(us("avro", avro))
                assert applied, f"{k}: the edit did not apply to the generated loop"
            got["json sink"].append(us("json", js))
    report(got, n, rounds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
