"""The Avro record format (``[sink] format = "avro"``, the Confluent wire format): format.py
(AvroFormat, registered in registry.FORMATS), schemas.py (writer schemas by id, through
schema_source.py), values.py (the Avro value rules per column type), raw.py (a writer
schema read without the logical types the fast path takes itself), rows.py (the batch loop
generated per writer schema) and decode.py (its generated decode of a plain record)."""
