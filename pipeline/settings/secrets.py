"""Secrets kept out of what the job prints, logs and stores: a database URL's password, a
Kafka client setting whose key names a secret, and mask() for any text (an error from
Spark, a driver, a library) that may quote them."""

from __future__ import annotations

import logging
import re

from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError

SECRET_KEY = re.compile(r"(password|secret|token|sasl\.jaas|credentials)", re.I)


def redact_url(url: str) -> str:
    """The URL with its password masked (SQLAlchemy's URL parser does the quoting right)."""
    try:
        return make_url(url).render_as_string(hide_password=True)
    except ArgumentError:
        return "<unparsable database url>"


def redact_settings(settings: dict[str, str]) -> dict[str, str]:
    return {k: ("***" if SECRET_KEY.search(k) else v) for k, v in settings.items()}


# Masking by structure, not by the secret's text (a password may be a common word that
# also appears in the message): a URL's password field, the value after a secret key
# ("sasl.password = ...", "'ssl.key.password': '...'"), and password= in a libpq conninfo
# or a JAAS line.
_URL = re.compile(r"\b[a-zA-Z][a-zA-Z0-9+.-]*://[^\s/?#'\"]+")
_SECRET_VALUE = re.compile(
    r"(?P<key>[\w.-]*(?:password|secret|token|sasl\.jaas\.config|credentials)[\w.-]*)"
    r"(?P<sep>(?:[\"']\s*[:=]|\s*=)\s*)"
    r"(?P<value>\\\"(?:(?!\\\").)*\\\"|\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'|[^\s,;)}\]]+)",
    re.I)


def mask(text: str) -> str:
    """``text`` with every secret it carries, by its place in the text, shown as ***."""
    def url(m: re.Match) -> str:
        # The authority ends at the first / ? #; its user info at the last @ (as urlsplit).
        head, at, host = m.group(0).rpartition("@")
        scheme, _, userinfo = head.partition("://")
        if not at or ":" not in userinfo:
            return m.group(0)
        return f"{scheme}://{userinfo.split(':', 1)[0]}:***@{host}"

    def value(m: re.Match) -> str:
        v = m.group("value")
        quote = v[:2] if v.startswith('\\"') else v[:1] if v[:1] in "'\"" else ""
        return f"{m.group('key')}{m.group('sep')}{quote}***{quote}"

    return _SECRET_VALUE.sub(value, _URL.sub(url, text))


class MaskingFilter(logging.Filter):
    """Log records pass through mask() (install on a handler)."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = mask(record.getMessage()), ()
        return True


MASK_LOGS = MaskingFilter()  # one instance: adding it twice to a handler is a no-op
