"""The reader's stopping rule, on real confluent_kafka Messages built in memory: a range
ends at its planned end or at the end of its partition's log past it, never by waiting for
a batch that cannot fill."""

import pytest
from confluent_kafka import KafkaError, Message

from pipeline.errors import Kind, Where
from pipeline.executor.consume import (
    BATCH,
    RangeReadError,
    _Open,
    _runs,
    _stalled,
    _take,
    asked,
    read_ranges,
    reader_config,
)
from pipeline.plan.offsets import OffsetRange


def records(partition, offsets, topic="t"):
    return [Message(topic=topic, partition=partition, offset=o, value=b"{}") for o in offsets]


def eof(partition, log_end, topic="t"):
    return Message(topic=topic, partition=partition, offset=log_end,
                   error=KafkaError(KafkaError._PARTITION_EOF))


def test_a_consume_call_never_asks_for_more_messages_than_the_ranges_span():
    assert asked(100) == 100  # a small range: the call returns when its 100 records are in
    assert asked(3 * BATCH) == BATCH
    assert asked(0) == 1


def test_a_range_ends_at_its_planned_end_and_drops_what_follows():
    state = _Open(OffsetRange("t", 0, 2, 5))
    got = _take(state, records(0, range(2, 9)), {}, [])
    assert [m.offset() for m in got] == [2, 3, 4]
    assert state.done


def test_a_plain_batch_inside_the_range_is_taken_whole():
    state = _Open(OffsetRange("t", 0, 0, 100))
    batch = records(0, range(0, 40))
    assert _take(state, batch, {}, []) is batch
    assert state.next_offset == 40 and not state.done


def test_gaps_at_the_end_of_the_log_end_the_range_at_the_partition_eof():
    # Offsets 6-9 hold no record (a transaction marker, compaction): the log's end at 10
    # tells that nothing more of the range will come.
    state = _Open(OffsetRange("t", 0, 0, 10))
    got = _take(state, [*records(0, range(0, 6)), eof(0, 10)], {}, [])
    assert len(got) == 6 and state.done


def test_a_log_that_ends_before_the_planned_end_is_a_truncation_not_a_finished_range():
    state = _Open(OffsetRange("t", 0, 0, 10))
    _take(state, [*records(0, range(0, 4)), eof(0, 4)], {}, [])
    assert not state.done and state.log_end == 4
    error = _stalled({}, [state], 10, [])
    assert error.kind is Kind.PERMANENT and "ends at offset 4" in error.message
    assert error.where == Where("t", 0, 0, 10)


def test_no_progress_on_a_reachable_log_is_a_transient_error_naming_the_range():
    states = [_Open(OffsetRange("t", 0, 0, 10)), _Open(OffsetRange("t", 1, 5, 9))]
    error = _stalled({"bootstrap.servers": "k:9092"}, states, 30, ["broker down"])
    assert isinstance(error, RangeReadError)
    assert error.kind is Kind.TRANSIENT
    assert error.message.startswith("Kafka unreachable at k:9092")
    assert "t[0] [0, 10) (and 1 more ranges)" in error.message and "broker down" in error.message


def test_a_batch_of_several_partitions_is_split_per_range_and_finished_ones_are_dropped():
    reading = {("t", p): _Open(OffsetRange("t", p, 0, 3)) for p in (0, 1)}
    batch = [*records(0, [0, 1]), *records(1, [0]), *records(7, [0]), *records(0, [2]),
             eof(1, 1)]
    runs = [(state.range.partition, [m.offset() for m in run]) for state, run
            in _runs(batch, reading)]
    assert runs == [(0, [0, 1]), (1, [0]), (0, [2]), (1, [1])]


def test_another_partitions_message_is_never_taken_as_the_ranges_record():
    state = _Open(OffsetRange("t", 0, 0, 5))
    got = _take(state, [*records(0, [0]), *records(3, [1]), *records(0, [1])], {}, [])
    assert [(m.partition(), m.offset()) for m in got] == [(0, 0), (0, 1)]


def test_deleted_offsets_ahead_of_the_reader_are_a_transient_error():
    state = _Open(OffsetRange("t", 0, 0, 5))
    gone = Message(topic="t", partition=0, offset=0,
                   error=KafkaError(KafkaError.OFFSET_OUT_OF_RANGE))
    with pytest.raises(RangeReadError) as raised:
        _take(state, [gone], {}, [])
    assert raised.value.kind is Kind.TRANSIENT
    assert raised.value.message.startswith("t[0] [0, 5): offset 0 is no")


def test_settings_librdkafka_refuses_are_a_config_error_not_a_crash():
    # fetch.max.bytes below message.max.bytes: the consumer cannot even be created (no
    # broker needed); this used to reach the driver as an internal error (exit 1).
    config = reader_config({"bootstrap.servers": "127.0.0.1:1", "fetch.max.bytes": "2048"},
                           "read_committed", "g")
    with pytest.raises(RangeReadError) as e:
        list(read_ranges(config, [OffsetRange("t", 0, 0, 10)], 1.0))
    assert e.value.kind == "config" and "fetch.max.bytes" in e.value.message
    assert "[kafka.consumer]" in e.value.message
