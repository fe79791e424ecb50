"""The JSON record format (``[sink] format = "json"``): format.py (JsonFormat, registered in
registry.FORMATS), rows.py (the generated row encoder, its hot loop), values.py (the JSON
value rules per column type, which the Avro and Protobuf formats build on) and diagnose.py
(why a record is not a row)."""
