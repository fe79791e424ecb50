"""The protobuf format end to end through the stack's real Schema Registry (Apicurio,
speaking the Confluent API; scripts/registry): .proto schemas registered under
``<topic>-value``, records framed by hand in the Confluent wire format (magic byte, schema
id, message indexes) around messages compiled from the same .proto text, read by the
pipeline with ``[schema_registry] url``.

- the registry unreachable: exit 75, nothing committed (no row, no dead letter, no offset);
- then, reachable: v1 and a compatible v2 (a field added) in one run land every good record
  exactly at its offset, and a wrong magic byte, an unknown schema id and a truncated
  payload are dead letters with their reasons.
- an incompatible v3 (quantity int32 -> string), registered once the subject's
  compatibility is NONE: its records are dead letters naming the field and schema id, the
  v1 records around them land.
- records of confluent-kafka's own ProtobufSerializer (its default settings: schemas
  registered as base64 serialized descriptors, an imported file as a schema reference),
  run through the CLI, land without a dead letter.
"""

from __future__ import annotations

import socket
import struct
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from confluent_kafka.schema_registry import Schema

from pipeline.driver.job import run_ingest
from pipeline.errors import EXIT_TRANSIENT, TransientError
from pipeline.formats.protobuf.schemas import compile_proto
from tests.helpers import (
    cli_here,
    create_topic,
    init_cli,
    produce,
    query,
    stored_offsets,
    toml_config,
    unique,
)
from tests.integration._registry import (
    assert_rows_and_dead_letters,
    by_offset,
    dead_letters,
    log_ends,
    registry_client,
    registry_settings,
    table_rows,
)

pytestmark = pytest.mark.integration

# Order is the file's second message: its records carry message indexes [1].
V1 = """syntax = "proto3";
package {pkg};
import "google/protobuf/timestamp.proto";
message Refund {{ int64 order_id = 1; }}
enum Status {{ NEW = 0; PAID = 1; SHIPPED = 2; }}
message Order {{
  int64 order_id = 1;
  string customer = 2;
  int32 quantity = 3;
  double amount = 4;
  google.protobuf.Timestamp placed_at = 5;
  Status status = 6;
{extra}}}
"""
CHANNEL = "  optional string channel = 7;\n"  # v2: a field added (compatible)
ORDER_INDEXES = b"\x02\x02"  # count 1, index 1 (zigzag varints)
COLUMNS = {"order_id": "long not null", "customer": "string not null", "quantity": "long",
           "amount": "double", "placed_at": "timestamp", "status": "string",
           "channel": "string"}
SELECT = "order_id, customer, quantity, amount, placed_at, status, channel"
T0 = datetime(2026, 11, 25, 12, 0, tzinfo=UTC)


def order_class(text: str, pkg: str):
    """The Order message class of a .proto text, as a producer's generated code would be."""
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass

    data, error = compile_proto(text)
    assert data is not None, error
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString(data).file:
        pool.Add(f)
    return GetMessageClass(pool.FindMessageTypeByName(f"{pkg}.Order"))


def order(cls, i: int, v2: bool) -> tuple[object, tuple]:
    """(the message, the row it must become)."""
    at = T0 + timedelta(seconds=i, microseconds=i * 7)
    msg = cls(order_id=i, customer=f"c{i % 13}\t'", quantity=i % 5, amount=i + 0.25,
              status=i % 3)
    msg.placed_at.FromDatetime(at)
    channel = None
    if v2 and i % 2:
        channel = msg.channel = f"app-{i}"
    return msg, (i, msg.customer, i % 5, i + 0.25, at, ("NEW", "PAID", "SHIPPED")[i % 3],
                 channel)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def settings(name: str, topic: str, url: str):
    return registry_settings("protobuf", name, topic, url, COLUMNS)


def test_protobuf_through_the_registry_is_exact_with_evolution_and_dead_letters(
        registry, spark):
    name = unique("protoreg")
    topic = create_topic(name, partitions=2)
    client = registry_client(registry)
    subject, pkg = f"{topic}-value", f"test.{name}"
    text1, text2 = V1.format(pkg=pkg, extra=""), V1.format(pkg=pkg, extra=CHANNEL)
    id1 = client.register_schema(subject, Schema(text1, "PROTOBUF"))
    id2 = client.register_schema(subject, Schema(text2, "PROTOBUF"))  # compatible: passes
    assert id2 != id1 and client.get_versions(subject) == [1, 2]

    made = ([order(order_class(text1, pkg), i, False) for i in range(150)]
            + [order(order_class(text2, pkg), i, True) for i in range(150, 300)])
    values = [struct.pack(">bI", 0, id1 if i < 150 else id2) + ORDER_INDEXES
              + m.SerializeToString() for i, (m, _) in enumerate(made)]
    rows_of = dict(zip(values, [r for _, r in made], strict=True))
    unknown_id = max(id1, id2) + 100_000
    bad = {b"\x01" + values[0][1:]: "bad_magic_byte",
           values[1][:1] + struct.pack(">I", unknown_id) + values[1][5:]: "unknown_schema",
           values[151][:-3]: "corrupt_protobuf"}  # cut inside the channel string
    records = [(str(i).encode(), v) for i, v in enumerate(values)]
    records[150:150] = [(b"bad", v) for v in bad]  # between the versions
    produce(topic, records)

    # Unreachable first: the run stops before anything is written.
    down = settings(name, topic, f"http://127.0.0.1:{closed_port()}/apis/ccompat/v7")
    with pytest.raises(TransientError) as e:
        run_ingest(down)
    assert e.value.exit_code == EXIT_TRANSIENT
    assert "unreachable fetching schema id" in str(e.value), str(e.value)
    assert stored_offsets(name) == {} and query(f"SELECT count(*) FROM {name}") == [(0,)]
    assert dead_letters(name) == {}

    result = run_ingest(settings(name, topic, registry))

    assert (result.status, result.records_read, result.rows_written, result.dead_letters) == (
        "succeeded", 303, 300, 3)
    _, reasons = assert_rows_and_dead_letters(name, topic, SELECT, rows_of, bad, unknown_id)
    assert (f"does not decode as {pkg}.Order of writer schema id {id2}"
            in reasons["corrupt_protobuf"]), reasons
    assert stored_offsets(name) == log_ends(topic)


QTY_TEXT = "  string quantity = 3;\n"  # v3: quantity int32 -> string (incompatible)


def test_an_incompatible_writer_schema_makes_its_records_dead_letters_naming_field_and_id(
        registry, spark):
    # What docs/reliability.md says of an incompatible writer schema: the pipeline reads
    # schema ids, not subjects, so it does not refuse before reading; each record of the
    # incompatible version is a dead letter naming the field and schema id, the records
    # around it land.
    name = unique("protoreg_v3")
    topic = create_topic(name, partitions=2)
    client = registry_client(registry)
    subject, pkg = f"{topic}-value", f"test.{name}"
    text1 = V1.format(pkg=pkg, extra="")
    text3 = V1.format(pkg=pkg, extra="").replace("  int32 quantity = 3;\n", QTY_TEXT)
    id1 = client.register_schema(subject, Schema(text1, "PROTOBUF"))
    assert client.test_compatibility(subject, Schema(text3, "PROTOBUF")) is False
    client.set_compatibility(subject, "NONE")
    id3 = client.register_schema(subject, Schema(text3, "PROTOBUF"))
    assert id3 != id1
    cls1, cls3 = order_class(text1, pkg), order_class(text3, pkg)
    made = [order(cls1, i, False) for i in range(100)]
    values = []
    for i, (m, _) in enumerate(made):
        if i % 4 == 3:  # the same order under v3: quantity as text
            m3 = cls3(order_id=m.order_id, customer=m.customer, quantity=str(i % 5),
                      amount=m.amount, status=m.status)
            m3.placed_at.MergeFromString(m.placed_at.SerializeToString())
            values.append(struct.pack(">bI", 0, id3) + ORDER_INDEXES + m3.SerializeToString())
        else:
            values.append(struct.pack(">bI", 0, id1) + ORDER_INDEXES + m.SerializeToString())
    produce(topic, [(str(i).encode(), v) for i, v in enumerate(values)])

    result = run_ingest(settings(name, topic, registry))

    assert (result.status, result.rows_written, result.dead_letters) == ("succeeded", 75, 25)
    rows_of = {v: r for i, (v, (_, r)) in enumerate(zip(values, made, strict=True))
               if i % 4 != 3}
    want = by_offset(topic, rows_of)
    assert table_rows(name, SELECT) == {po: r for po, r in want.items() if type(r) is tuple}
    dead = dead_letters(name)
    assert sorted(v for _, _, v in dead.values()) == sorted(
        v for i, v in enumerate(values) if i % 4 == 3)
    assert {(t, m) for t, m, _ in dead.values()} == {(
        "wrong_type", f"field 'quantity' (writer schema id {id3}): expected long, got string")}
    assert stored_offsets(name) == log_ends(topic)


# A producer's own files, as protoc would compile them: Order imports a file of shared
# types (a schema reference) and a well-known type (no reference: the registry's built-in).
COMMON = """syntax = "proto3";
package {pkg};
message Money {{ string currency = 1; double amount = 2; }}
"""
WITH_MONEY = """syntax = "proto3";
package {pkg};
import "google/protobuf/timestamp.proto";
import "{common}";
message Order {{
  int64 order_id = 1;
  string customer = 2;
  Money total = 3;
  google.protobuf.Timestamp placed_at = 4;
}}
"""


def serializer_classes(pkg: str, common: str, tmp):
    """The Order class as generated code has it: its file and its dependency's in one pool
    (the serializer registers the dependency as a reference from the file's descriptor)."""
    import grpc_tools
    from google.protobuf import descriptor_pb2, descriptor_pool
    from google.protobuf.message_factory import GetMessageClass
    from grpc_tools import protoc

    (tmp / common).parent.mkdir(parents=True)
    (tmp / common).write_text(COMMON.format(pkg=pkg))
    (tmp / "order.proto").write_text(WITH_MONEY.format(pkg=pkg, common=common))
    includes = Path(grpc_tools.__file__).parent / "_proto"
    assert protoc.main(["protoc", f"-I{tmp}", f"-I{includes}", "--include_imports",
                        f"--descriptor_set_out={tmp / 'set.pb'}", "order.proto"]) == 0
    pool = descriptor_pool.DescriptorPool()
    for f in descriptor_pb2.FileDescriptorSet.FromString((tmp / "set.pb").read_bytes()).file:
        pool.Add(f)
    return GetMessageClass(pool.FindMessageTypeByName(f"{pkg}.Order"))


def test_records_of_confluent_kafkas_own_protobuf_serializer_land_through_the_cli(
        registry, tmp_path):
    # confluent-kafka's ProtobufSerializer, default settings: it registers each file as a
    # base64 serialized FileDescriptorProto, the imported one under its own subject as a
    # schema reference; the registry hands both back as registered.
    from confluent_kafka.schema_registry.protobuf import ProtobufSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    name = unique("protoser")
    topic = create_topic(name, partitions=1)
    pkg, common = f"test.{name}", f"{name}/common.proto"
    cls = serializer_classes(pkg, common, tmp_path)
    serialize = ProtobufSerializer(cls, registry_client(registry))
    ctx = SerializationContext(topic, MessageField.VALUE)
    want = {}
    records = []
    for i in range(20):
        msg = cls(order_id=i, customer=f"c{i}")
        msg.total.currency, msg.total.amount = "EUR", i + 0.5
        msg.placed_at.FromDatetime(T0 + timedelta(seconds=i))
        records.append((str(i).encode(), serialize(msg, ctx)))
        want[i] = (i, f"c{i}", "EUR", i + 0.5, T0 + timedelta(seconds=i))
    produce(topic, records)
    config = tmp_path / "p.toml"
    config.write_text(toml_config(name, [name], fmt="protobuf") + f"""
[sink.columns]
order_id = "long not null"
customer = "string not null"
currency = {{ type = "string", from = "total.currency" }}
total = {{ type = "double", from = "total.amount" }}
placed_at = "timestamp"
[schema_registry]
url = "{registry}"
""")
    init_cli(config)

    proc = cli_here("run", "--config", str(config))

    assert proc.returncode == 0, proc.stderr[-3000:]
    assert query("SELECT error_type, error_message FROM pipeline_dead_letters WHERE "
                 "pipeline = %s LIMIT 1", (name,)) == []
    got = query(f"SELECT order_id, customer, currency, total, placed_at FROM {name} "
                "ORDER BY order_id")
    assert got == [want[i] for i in range(20)]
