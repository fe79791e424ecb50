"""The raw record format: the record as it is (key, value, headers, timestamp), no
decoding; its rows are COPY binary tuples (wire/binary.py) of
(topic, partition, offset, key, value, headers, kafka_timestamp, run_id)."""

from __future__ import annotations

import struct
from collections.abc import Callable

from pipeline.formats.timestamps import PG_END_MS, PG_FIRST_MS, TimestampOutOfRange
from pipeline.formats.wire.binary import (
    BINARY,
    EMPTY_JSONB_ARRAY,
    NULL_FIELD,
    PG_EPOCH_MS,
    pack_i,
    pack_iq,
    pack_q,
    text_field,
)
from pipeline.formats.wire.text import Unstorable, headers_plain


class RawFormat:
    """Every record is a row, but one Postgres cannot store (a NUL in a header key)."""
    wire = BINARY

    def __init__(self, columns=(), run_id: int = 0):
        self.tail = pack_iq(8, run_id)

    def rows(self, topic: str, partition: int, head: str, records, rejected: list,
             refuse: Callable) -> list[bytes]:
        """The batch's tuples; a record Postgres cannot store goes to ``refuse(record,
        error_type, message)``, a timestamp it cannot hold raises TimestampOutOfRange
        (Encoder.encode then makes that record a dead letter). Nothing is ``rejected``."""
        prefix = (struct.pack(">h", 8) + text_field(topic) + struct.pack(">ii", 4, partition)
                  + pack_i(8))
        tail = self.tail
        first, end, pg_epoch = PG_FIRST_MS, PG_END_MS, PG_EPOCH_MS
        rows = []
        append = rows.append
        for m in records:
            k, v, h = m.key(), m.value(), m.headers()
            if h:
                try:
                    hj = b"\x01" + headers_plain(h).encode()
                except Unstorable as e:
                    refuse(m, "unstorable", f"header key {e}")
                    continue
                hf = pack_i(len(hj)) + hj
            else:
                hf = EMPTY_JSONB_ARRAY
            ms = m.timestamp()[1]
            if not first <= ms < end:  # Postgres's COPY would refuse the whole batch
                raise TimestampOutOfRange(ms)
            append(b"".join((
                prefix, pack_q(m.offset()),
                NULL_FIELD if k is None else pack_i(len(k)) + k,
                NULL_FIELD if v is None else pack_i(len(v)) + v,
                hf, pack_iq(8, (ms - pg_epoch) * 1000), tail)))
        return rows

    def explain(self, m) -> tuple[str, str]:
        """Never asked: rows() rejects nothing (each record is a row or refused)."""
        raise NotImplementedError("the raw format rejects no record")
