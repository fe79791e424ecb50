"""The COPY wire encodings staged rows are written in: text.py (COPY text: the json,
protobuf and debezium formats' rows, tombstones, every dead letter) and binary.py (COPY
binary: the raw format's rows, avro's where its columns allow). A format's ``wire`` says
which (registry.py); the publisher frames a binary stream (SIGNATURE, TRAILER)."""
