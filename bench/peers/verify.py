"""What a contender wrote, reduced to numbers every contender must agree on."""

from __future__ import annotations

import psycopg


def checksum(db_url: str, table: str) -> tuple:
    """(rows, sum(order_id), sum(amount), sum of placed_at epochs, distinct coordinates,
    md5 of the customers in offset order)."""
    with psycopg.connect(db_url) as conn:
        return conn.execute(
            f'SELECT count(*), sum(order_id), sum(amount), sum(extract(epoch FROM placed_at)), '
            f'count(DISTINCT ("partition", "offset")), '
            f'md5(string_agg(customer, \',\' ORDER BY "partition", "offset")) FROM {table}'
        ).fetchone()
