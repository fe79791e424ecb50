"""Debezium change events (``[sink] envelope = "debezium"``, an upsert sink): envelope.py
(what a change event is, whatever its encoding), json.py (DebeziumFormat: JSON events, bare
or in Kafka Connect's schema envelope) and avro.py (DebeziumAvroFormat: Avro events through
Confluent's AvroConverter), registered in registry.FORMATS as "debezium" and
"debezium_avro" (settings: the sink's record_format)."""
