// Command writer commits an order and its events through the transactional outbox (pgx v5).
//
// Usage: DATABASE_URL=postgresql://... [TRACEPARENT=00-...] writer ORDER_ID
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log"
	"os"

	"github.com/jackc/pgx/v5"
)

var errPaymentDeclined = errors.New("refund refused by the payment provider")

// traceHeaders returns the caller's W3C trace context (TRACEPARENT/TRACESTATE, as OpenTelemetry
// passes it to a process), or a new trace. In a service, inject the current span's context here.
func traceHeaders() map[string]string {
	traceparent := os.Getenv("TRACEPARENT")
	if traceparent == "" {
		traceparent = fmt.Sprintf("00-%s-%s-01", randomHex(16), randomHex(8))
	}
	headers := map[string]string{"traceparent": traceparent}
	if ts := os.Getenv("TRACESTATE"); ts != "" {
		headers["tracestate"] = ts
	}
	return headers
}

func randomHex(n int) string {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		log.Fatal(err)
	}
	return hex.EncodeToString(b)
}

func main() {
	ctx := context.Background()
	orderID := "order-" + randomHex(4)
	if len(os.Args) > 1 {
		orderID = os.Args[1]
	}
	headers := traceHeaders()

	conn, err := pgx.Connect(ctx, os.Getenv("DATABASE_URL"))
	if err != nil {
		log.Fatal(err)
	}
	defer conn.Close(ctx)
	if _, err := conn.Exec(ctx, `CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY,
		status text NOT NULL, amount_cents integer NOT NULL)`); err != nil {
		log.Fatal(err)
	}

	// One transaction: the business row and its event commit together or not at all.
	// pgx encodes Go maps as json/jsonb parameters.
	var eventID int64
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `INSERT INTO orders (id, status, amount_cents) VALUES ($1, 'placed', 1999)`,
			orderID); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `INSERT INTO outbox_events (topic, aggregate_id, payload, headers)
			VALUES ($1, $2, $3, $4) RETURNING id`, "order.placed", orderID,
			map[string]any{"order_id": orderID, "amount_cents": 1999}, headers).Scan(&eventID)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("committed order.placed id=%d\n", eventID)

	// The same with the convenience function, which returns the event id.
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'paid' WHERE id = $1`, orderID); err != nil {
			return err
		}
		return tx.QueryRow(ctx, `SELECT outbox_publish($1, $2, $3, $4)`, "order.paid", orderID,
			map[string]any{"order_id": orderID}, headers).Scan(&eventID)
	})
	if err != nil {
		log.Fatal(err)
	}
	fmt.Printf("committed order.paid id=%d\n", eventID)

	// A failure after the INSERT rolls back the business change and the event: nothing is sent.
	err = pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `UPDATE orders SET status = 'cancelled' WHERE id = $1`, orderID); err != nil {
			return err
		}
		if err := tx.QueryRow(ctx, `INSERT INTO outbox_events (topic, aggregate_id, payload, headers)
			VALUES ($1, $2, $3, $4) RETURNING id`, "order.cancelled", orderID,
			map[string]any{"order_id": orderID}, headers).Scan(&eventID); err != nil {
			return err
		}
		return errPaymentDeclined
	})
	if !errors.Is(err, errPaymentDeclined) {
		log.Fatalf("expected the payment failure, got %v", err)
	}
	fmt.Printf("rolled back order.cancelled id=%d: %v\n", eventID, err)
}
