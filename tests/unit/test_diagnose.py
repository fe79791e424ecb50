"""The explanation of a bad record, without Spark."""

from pipeline.formats.json.diagnose import diagnose
from pipeline.formats.wire.text import escape as copy_escape

COLUMNS = [("order_id", "long"), ("customer", "string"), ("amount", "decimal(12,2)")]


def test_codes_decided_in_spark_name_their_error():
    assert diagnose("null_value", None, None, COLUMNS)[0] == "null_value"
    assert diagnose("invalid_utf8", b"\xff", None, COLUMNS)[0] == "invalid_utf8"
    assert diagnose("missing:customer", b'{"order_id": 1}', None, COLUMNS) == (
        "missing_field", "required field 'customer' is missing or null")
    assert diagnose("string:customer", b'{"order_id": 1, "customer": 7}', None, COLUMNS) == (
        "wrong_type", "field 'customer': expected string, got bigint")


def test_a_rejected_parse_is_explained_by_an_untyped_look():
    assert diagnose("parse", b"{not json", None, COLUMNS)[0] == "malformed_json"
    assert diagnose("parse", b"", None, COLUMNS)[0] == "malformed_json"
    assert diagnose("parse", b"[1, 2]", None, COLUMNS) == (
        "not_an_object", "value is JSON array, expected an object")
    assert diagnose("parse", b"null", None, COLUMNS)[0] == "not_an_object"
    # Spark could not convert order_id (its typed parse has it null), the raw value is there.
    assert diagnose("parse", b'{"order_id": "seven", "customer": "c"}',
                    '{"customer": "c"}', COLUMNS) == (
        "wrong_type", "field 'order_id': expected long, got string")
    assert diagnose("parse", b'{"order_id": 1}', '{"order_id": 1}', COLUMNS) == (
        "malformed_json", "value does not match the declared columns")


def test_copy_escape_escapes_what_copy_text_format_unescapes():
    assert copy_escape("a\tb\nc\rd\\e") == "a\\tb\\nc\\rd\\\\e"


DEEP = 3000  # beyond Python's recursion limit (1000) and Spark's Jackson nesting limit
DEEP_FIELD = (b'{"order_id": 1, "customer": "c", "extra": ' + b"[" * DEEP + b"]" * DEEP
              + b"}")
DEEP_ARRAY = b"[" * DEEP + b"]" * DEEP


def test_json_nested_3000_deep_is_explained_as_malformed_not_a_crash():
    for value in (DEEP_FIELD, DEEP_ARRAY):
        for code in ("parse", "string:customer"):
            error_type, message = diagnose(code, value, None, COLUMNS)
            assert error_type == "malformed_json" and "deeper" in message, (code, message)
    assert diagnose("parse", b'{"order_id": "x"}', b"[" * DEEP, COLUMNS)[0] == "wrong_type"
