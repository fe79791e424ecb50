"""A primary-key change (``UPDATE t SET id = new WHERE id = old``): Debezium writes a
delete of the old key (header ``__debezium.newkey``), its tombstone, and a create of the
new key whose header ``__debezium.oldkey`` holds the old Kafka key. A column that create
leaves out (an unchanged TOASTed value's placeholder) had its value under the old key: the
staged row carries that key (store/tables.old_key_columns, after ``_unavailable``) and the
upsert fills the column from the old key's latest state (sinks/upsert.py). Any other row
carries NULLs there. Pure: the formats decode the header's key as they decode a Kafka key.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from pipeline.formats.tombstones import BadTombstone, key_fields
from pipeline.formats.types import column_type
from pipeline.formats.wire.text import NULL

HEADER = "__debezium.oldkey"


def header(m) -> bytes | None:
    """The record's ``__debezium.oldkey`` header (its last), None without one."""
    found = None
    for name, value in m.headers() or ():
        if name == HEADER:
            found = value
    return found


class OldKey:
    """The old-key fields of a staged row: ``columns`` the declared (name, type, required,
    path) columns, ``key`` the upsert key's names (empty: no such fields)."""

    def __init__(self, columns: Sequence[tuple], key: Sequence[str]):
        declared = {c[0]: c for c in columns}
        # As the Encoder names a tombstone's key: the old key then names the row the
        # delete before it removed.
        self.columns = [(n, column_type(declared[n][1]).from_json, declared[n][1],
                         declared[n][3]) for n in key]
        self.nulls = f"\t{NULL}" * len(key)

    def fields(self, m, document: Callable[[bytes], object]) -> str:
        """``\\t``-led COPY text fields of ``m``'s old key (``document``: the format's
        decoding of a Kafka key's bytes), NULLs without the header; raises BadTombstone
        for a header that cannot name the key."""
        if not self.columns:
            return ""
        raw = header(m)
        if raw is None:
            return self.nulls
        try:
            return "\t" + "\t".join(key_fields(document(raw), self.columns))
        except BadTombstone as e:
            raise BadTombstone(f"its {HEADER} header cannot name the old key (it "
                               f"{e.args[0]})") from None

    @staticmethod
    def explain(e: BadTombstone) -> tuple[str, str]:
        """The dead letter of a create whose old key cannot be read."""
        return ("bad_old_key", f"the create of a primary-key change that left a column out: "
                f"{e.args[0]}, so the value it had under the old key cannot be found")
