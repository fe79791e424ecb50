"""The raw record format (``[sink] format = "raw"``): format.py (RawFormat, registered in
registry.FORMATS): the record as it is, no decoding, its rows COPY binary tuples."""
