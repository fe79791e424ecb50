"""A client whose security.protocol is not its listener's is told from what librdkafka
says (driver/kafka_meta.protocol_mismatch), so the run stops at once with a line that
says so, instead of retrying for kafka.timeout_seconds and calling Kafka unreachable."""

from __future__ import annotations

from pipeline.driver.kafka_meta import CLOSED_CONNECTIONS, protocol_mismatch

TLS_TO_PLAINTEXT = ("sasl_ssl://127.0.0.1:9092/bootstrap: SSL handshake failed: "
                    "Disconnected: SSL connection closed by peer: connecting to a PLAINTEXT "
                    "broker listener? (after 31ms in state SSL_HANDSHAKE)")
CLOSED = ("FAIL [rdkafka#producer-1] [thrd:127.0.0.1:9094/bootstrap]: 127.0.0.1:9094/"
          "bootstrap: Disconnected: connection closed by peer: receive 0 after POLLIN "
          "(after 1ms in state APIVERSION_QUERY)")
REFUSED = ("FAIL [rdkafka#producer-1] [thrd:127.0.0.1:9/bootstrap]: 127.0.0.1:9/bootstrap: "
           "Connect to ipv4#127.0.0.1:9 failed: Connection refused (after 0ms in state "
           "CONNECT)")


def test_tls_spoken_to_a_plaintext_listener_is_named():
    why = protocol_mismatch("SASL_SSL", ["1/1 brokers are down", TLS_TO_PLAINTEXT])
    assert why and why.startswith("it speaks TLS to a PLAINTEXT listener")


def test_plain_text_to_a_listener_that_closes_every_connection_is_named():
    assert protocol_mismatch("PLAINTEXT", [CLOSED] * (CLOSED_CONNECTIONS - 1)) is None
    why = protocol_mismatch("SASL_PLAINTEXT", [CLOSED] * CLOSED_CONNECTIONS)
    assert why and "TLS (SSL or SASL_SSL) listener" in why


def test_a_broker_that_is_down_or_a_matching_listener_is_no_mismatch():
    assert protocol_mismatch("PLAINTEXT", [REFUSED] * 10 + ["1/1 brokers are down"]) is None
    assert protocol_mismatch("SASL_SSL", [CLOSED] * 10) is None  # TLS is spoken there
