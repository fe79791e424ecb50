"""Record formats: a Kafka record's bytes -> typed values -> Postgres COPY lines, and the
dead-letter reason when that fails. Runs on the executors; pure, unit-tested without Spark.

Two separate concepts: a record *format* says how a record's value becomes a row or a
dead-letter reason, one folder each (json/, raw/, avro/, protobuf/, debezium/) registered in
registry.FORMATS; a *wire* encoding (wire/: COPY text, COPY binary) says how rows are
written for COPY. What every format shares is here: encode.Encoder picks the format once
and adds the guard that makes any failing record a dead letter, tombstones
(tombstones.py) and dead-letter lines (dead_letters.py); types.py is the one column-type
registry; paths.py, timestamps.py, documents.py (jsonb, arrays), binary_fields.py,
schema_source.py (writer schemas by id) and refused.py serve the formats that need them. A
new format is a folder and a line in registry.FORMATS. Nothing here imports executor/ (a
task's failure is errors.TaskError).
"""
