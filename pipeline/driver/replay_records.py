"""A stored dead letter as the record it was, and what re-decoding a batch of them gives:
pure (no database), unit-tested.

A dead letter keeps the record's key, value, headers and timestamp (formats/dead_letters.py
wrote them), so ``StoredRecord`` gives ``formats.encode.Encoder`` the same bytes the
executors gave it from Kafka: a replayed record becomes exactly the row an ingest with the
current ``[sink]`` would have written.
"""

from __future__ import annotations

import base64
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.config import Settings
from pipeline.formats.dead_letters import dead_line
from pipeline.formats.encode import Encoder
from pipeline.formats.timestamps import PG_END_MS
from pipeline.formats.wire.text import text

CREATE_TIME = 1  # confluent-kafka's TIMESTAMP_CREATE_TIME; the formats read only the ms


def headers_from_json(doc: list[dict] | None) -> list[tuple[str, bytes | None]] | None:
    """pipeline_dead_letters.headers (wire/text.headers_plain, or headers_escaped for keys
    jsonb refuses) -> the record's headers as confluent-kafka returns them (None: none)."""
    if not doc:
        return None
    out = []
    for h in doc:
        key = (base64.b64decode(h["key_b64"]).decode() if "key_b64" in h else h["key"])
        value = h.get("value_b64")
        out.append((key, None if value is None else base64.b64decode(value)))
    return out


class StoredRecord:
    """A dead letter's row (topic, partition, offset, key, value, headers, timestamp ms,
    ...) with confluent-kafka Message's methods. A timestamp Postgres could not hold was
    stored NULL: such a record reads as one past Postgres's range (it fails as before)."""

    __slots__ = ("_offset", "_key", "_value", "_headers", "_ms")

    def __init__(self, row: Sequence):
        self._offset, self._key, self._value = row[2], _bytes(row[3]), _bytes(row[4])
        self._headers = headers_from_json(row[5])
        self._ms = PG_END_MS if row[6] is None else row[6]

    def offset(self) -> int:
        return self._offset

    def key(self) -> bytes | None:
        return self._key

    def value(self) -> bytes | None:
        return self._value

    def headers(self):
        return self._headers

    def timestamp(self) -> tuple[int, int]:
        return CREATE_TIME, self._ms


def _bytes(v) -> bytes | None:
    return None if v is None else bytes(v)  # psycopg returns bytea as bytes or memoryview


@dataclass
class Decoded:
    """One partition's batch of dead letters, decoded again: the wire lines of the rows
    and tombstones, the dead-letter lines of what still fails, and the offsets of each."""

    rows: list
    tombstones: list[str]
    dead: list[str]
    replayed: list[int]
    failing: list[int]


def dead_offset(line: str) -> int:
    """The offset of a dead-letter line (topic, partition, offset, ... as COPY text; a
    topic's tab is escaped, so the third field is the offset)."""
    return int(line.split("\t", 3)[2])


def decode(encoder: Encoder, topic: str, partition: int, rows: Sequence[Sequence]) -> Decoded:
    """Re-decode a batch of one partition's dead letters (StoredRecord's rows). A record
    whose timestamp was not stored (beyond Postgres) cannot be decoded as it was: it keeps
    its stored reason."""
    decodable = [r for r in rows if r[6] is not None]
    kept = [r for r in rows if r[6] is None]
    enc = encoder.encode(topic, partition, [StoredRecord(r) for r in decodable])
    head = f"{text(topic)}\t{partition}\t"
    dead = list(enc.dead) + [dead_line(head, StoredRecord(r), r[7], r[8]) for r in kept]
    failing = sorted(dead_offset(d) for d in dead)
    gone = set(failing)
    return Decoded(list(enc.rows), list(enc.tombstones), dead,
                   [r[2] for r in rows if r[2] not in gone], failing)


def refusal(settings: Settings) -> str | None:
    """Why this pipeline's dead letters cannot be replayed exactly; None: they can."""
    if settings.sink.transform:
        return (f"pipeline '{settings.name}' has a [sink] transform "
                f"({settings.sink.transform!r}): its rows come from Spark SQL and that "
                "function over whole batches, not from the record format's encoder, so "
                "re-decoding one dead letter on the driver could not promise the row the "
                "run would have written; refused, nothing changed - re-read the offsets "
                "instead ('pipeline backfill --reprocess' over the dead letters' ranges, "
                "which replaces what they held)")
    return None
