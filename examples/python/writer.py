"""Writes an order and its events through the transactional outbox (psycopg 3).

Usage: DATABASE_URL=postgresql://... [TRACEPARENT=00-...] python writer.py ORDER_ID
"""
from __future__ import annotations

import os
import secrets
import sys

import psycopg
from psycopg.types.json import Jsonb


class PaymentDeclined(Exception):
    pass


def trace_headers() -> dict[str, str]:
    """The caller's W3C trace context (TRACEPARENT/TRACESTATE, as OpenTelemetry passes it to a
    process), or a new trace. In a service, inject the current span's context here instead."""
    traceparent = os.environ.get("TRACEPARENT") or f"00-{secrets.token_hex(16)}-{secrets.token_hex(8)}-01"
    headers = {"traceparent": traceparent}
    if os.environ.get("TRACESTATE"):
        headers["tracestate"] = os.environ["TRACESTATE"]
    return headers


def main() -> int:
    order_id = sys.argv[1] if len(sys.argv) > 1 else "order-" + secrets.token_hex(4)
    headers = trace_headers()
    with psycopg.connect(os.environ["DATABASE_URL"]) as conn:
        conn.execute("CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, status text NOT NULL,"
                     " amount_cents integer NOT NULL)")
        conn.commit()

        # One transaction: the business row and its event commit together or not at all.
        with conn.transaction():
            conn.execute("INSERT INTO orders (id, status, amount_cents) VALUES (%s, 'placed', 1999)", (order_id,))
            event_id = conn.execute(
                "INSERT INTO outbox_events (topic, aggregate_id, payload, headers)"
                " VALUES (%s, %s, %s, %s) RETURNING id",
                ("order.placed", order_id, Jsonb({"order_id": order_id, "amount_cents": 1999}), Jsonb(headers)),
            ).fetchone()[0]
        print(f"committed order.placed id={event_id}")

        # The same with the convenience function, which returns the event id.
        with conn.transaction():
            conn.execute("UPDATE orders SET status = 'paid' WHERE id = %s", (order_id,))
            event_id = conn.execute("SELECT outbox_publish(%s, %s, %s, %s)",
                                    ("order.paid", order_id, Jsonb({"order_id": order_id}), Jsonb(headers))
                                    ).fetchone()[0]
        print(f"committed order.paid id={event_id}")

        # A failure after the INSERT rolls back the business change and the event: nothing is sent.
        try:
            with conn.transaction():
                conn.execute("UPDATE orders SET status = 'cancelled' WHERE id = %s", (order_id,))
                event_id = conn.execute(
                    "INSERT INTO outbox_events (topic, aggregate_id, payload, headers)"
                    " VALUES (%s, %s, %s, %s) RETURNING id",
                    ("order.cancelled", order_id, Jsonb({"order_id": order_id}), Jsonb(headers)),
                ).fetchone()[0]
                raise PaymentDeclined("refund refused by the payment provider")
        except PaymentDeclined as e:
            print(f"rolled back order.cancelled id={event_id}: {e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
