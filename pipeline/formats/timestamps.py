"""A Kafka record's timestamp (epoch ms) as Postgres's timestamptz takes it, in UTC: no
time zone of any OS or session takes part.

Kafka timestamps are whatever a producer sent: microseconds sent as milliseconds land
past year 9999 (where Python's datetime stops, and Postgres does not), and some beyond
what Postgres holds at all (such a record is a dead letter, not a COPY failing forever).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

# What timestamptz holds, in epoch ms: [4714-11-24 BC, 294277-01-01) UTC.
PG_FIRST_MS = -210_866_803_200_000
PG_END_MS = 9_224_318_016_000_000
EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


class TimestampOutOfRange(ValueError):
    """A Kafka timestamp outside what Postgres's timestamptz holds: the record is a dead
    letter ``timestamp_out_of_range`` (its timestamp NULL), not a COPY that fails forever."""

    def __init__(self, millis: int):
        super().__init__(f"Kafka timestamp {millis} ms is outside what Postgres can store "
                         "(4714-11-24 BC to 294276-12-31 UTC); a producer that sent micro- or "
                         "nanoseconds as milliseconds?")


class _Millis:
    """Epoch milliseconds -> COPY text, cached: a producer's batch shares its timestamps."""

    def __init__(self) -> None:
        self.cache: dict[int, str] = {}

    def __call__(self, millis: int) -> str:
        s = self.cache.get(millis)
        if s is None:
            if len(self.cache) > 100_000:
                self.cache.clear()
            seconds, ms = divmod(millis, 1000)
            try:
                d = EPOCH + timedelta(seconds=seconds)
                # The year padded by hand: %Y writes year 1 as "1", which Postgres reads
                # as 2001.
                s = f"{d.year:04d}-{d:%m-%d %H:%M:%S}.{ms:03d}000+00"
            except OverflowError:  # beyond datetime's years 1-9999
                s = far_timestamp(millis)
            self.cache[millis] = s
        return s


def far_timestamp(millis: int) -> str:
    """Epoch ms -> COPY text for any instant Postgres holds, years past 9999 and BC
    included (where Python's datetime stops); else TimestampOutOfRange. Integer arithmetic
    on the proleptic Gregorian calendar (H. Hinnant's days -> civil date), as Postgres."""
    if not PG_FIRST_MS <= millis < PG_END_MS:
        raise TimestampOutOfRange(millis)
    days, ms_of_day = divmod(millis, 86_400_000)
    z = days + 719_468  # days since 0000-03-01
    era, doe = divmod(z, 146_097)
    yoe = (doe - doe // 1460 + doe // 36_524 - doe // 146_096) // 365
    doy = doe - (365 * yoe + yoe // 4 - yoe // 100)
    mp = (5 * doy + 2) // 153
    day, month = doy - (153 * mp + 2) // 5 + 1, mp + 3 if mp < 10 else mp - 9
    year = yoe + era * 400 + (month <= 2)
    seconds, ms = divmod(ms_of_day, 1000)
    minutes, second = divmod(seconds, 60)
    hour, minute = divmod(minutes, 60)
    era_suffix = ""
    if year <= 0:  # no year 0: 1 BC precedes 1 AD
        year, era_suffix = 1 - year, " BC"
    return (f"{year:04d}-{month:02d}-{day:02d} {hour:02d}:{minute:02d}:{second:02d}"
            f".{ms:03d}000+00{era_suffix}")


kafka_timestamp = _Millis()
kafka_timestamp.__doc__ = "A record's timestamp (epoch ms) in UTC, as Spark's source has it."
