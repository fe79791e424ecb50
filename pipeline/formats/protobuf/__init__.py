"""The Protobuf record format (``[sink] format = "protobuf"``, the Confluent wire format):
format.py (ProtobufFormat, registered in registry.FORMATS), header.py (the wire header's
schema id and message indexes), schemas.py (writer schemas by id compiled into message
classes, through schema_source.py) and values.py (a message field -> the value the
column's Avro rule takes)."""
