"""A record a schema format (avro, protobuf) refuses: the dead letter's error type and
message, raised while decoding one value and caught by the format's batch loop."""

from __future__ import annotations


class Refused(ValueError):
    """A record that is not a result row: its dead letter's error type and message."""

    def __init__(self, error_type: str, message: str):
        super().__init__(message)
        self.error_type = error_type
        self.message = message
