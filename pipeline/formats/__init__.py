"""Record formats: a Kafka record's bytes -> typed values -> Postgres COPY lines, and the
dead-letter reason when that fails. Runs on the executors; pure, unit-tested without Spark.

Two separate concepts: a record *format* (registry.py: json/format.py, raw_format.py) says
how a record's value becomes a row or a dead-letter reason; a *wire* encoding
(wire/text.py, wire/binary.py) says how rows are written for COPY. encode.Encoder picks the
format once and adds what all formats share; types.py is the one column-type registry. A
new format (Avro, Protobuf, Debezium) is a new module and a line in registry.FORMATS.
"""
