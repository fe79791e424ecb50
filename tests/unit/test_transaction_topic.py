"""Whole source transactions on the driver: [sink] transactions in the settings, and the
transaction topic's events as plan/transactions.TransactionEnd values (JSON with and
without Kafka Connect's schema envelope, Avro's decoded record); no Kafka."""

from __future__ import annotations

import pytest

from pipeline.config import parse_settings
from pipeline.errors import ConfigError

DEBEZIUM = {"envelope": "debezium", "mode": "upsert", "key": ["id"]}


def settings(topics=("shop.public.orders",), **sink):
    return parse_settings({
        "pipeline": {"name": "p"},
        "kafka": {"bootstrap_servers": "h:9092", "topics": list(topics)},
        "database": {"url": "postgresql://u:pw@h/db"},
        "sink": {"format": "json", "table": "t", "columns": {"id": "long"}, **sink}},
        environ={})


def test_transactions_names_debeziums_transaction_topic():
    assert settings(**DEBEZIUM, transactions="shop.transaction").sink.transactions == \
        "shop.transaction"
    assert settings(**DEBEZIUM).sink.transactions is None
    for sink, topics, why in (
            ({"mode": "upsert", "key": ["id"]}, (), "only for sink.envelope = 'debezium'"),
            (DEBEZIUM, (), "is not a Kafka topic name"),
            (DEBEZIUM, ("shop.transaction",), "is also one of the pipeline.s topics")):
        with pytest.raises(ConfigError, match=why):
            settings(topics=("shop.public.orders", *topics), **sink,
                     transactions="shop.transaction" if "name" not in why else "a b")
