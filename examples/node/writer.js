// Commits an order and its events through the transactional outbox (node-postgres).
//
// Usage: DATABASE_URL=postgresql://... [TRACEPARENT=00-...] node writer.js ORDER_ID
'use strict';

const crypto = require('node:crypto');
const { Client } = require('pg');

class PaymentDeclined extends Error {}

// The caller's W3C trace context (TRACEPARENT/TRACESTATE, as OpenTelemetry passes it to a
// process), or a new trace. In a service, inject the current span's context here instead.
function traceHeaders() {
  const traceparent = process.env.TRACEPARENT ||
    `00-${crypto.randomBytes(16).toString('hex')}-${crypto.randomBytes(8).toString('hex')}-01`;
  const headers = { traceparent };
  if (process.env.TRACESTATE) headers.tracestate = process.env.TRACESTATE;
  return headers;
}

// Runs fn inside BEGIN/COMMIT on one client; any error rolls back and is rethrown.
async function inTransaction(client, fn) {
  await client.query('BEGIN');
  try {
    const result = await fn();
    await client.query('COMMIT');
    return result;
  } catch (err) {
    await client.query('ROLLBACK');
    throw err;
  }
}

const insertEvent = `INSERT INTO outbox_events (topic, aggregate_id, payload, headers)
                     VALUES ($1, $2, $3, $4) RETURNING id`;

async function main() {
  const orderId = process.argv[2] || `order-${crypto.randomBytes(4).toString('hex')}`;
  const headers = traceHeaders();
  const client = new Client({ connectionString: process.env.DATABASE_URL });
  await client.connect();
  try {
    await client.query(`CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, status text NOT NULL,
                        amount_cents integer NOT NULL)`);

    // One transaction: the business row and its event commit together or not at all.
    // pg sends plain objects as JSON text; ids (bigint) come back as strings.
    let id = await inTransaction(client, async () => {
      await client.query("INSERT INTO orders (id, status, amount_cents) VALUES ($1, 'placed', 1999)", [orderId]);
      const res = await client.query(insertEvent,
        ['order.placed', orderId, { order_id: orderId, amount_cents: 1999 }, headers]);
      return res.rows[0].id;
    });
    console.log(`committed order.placed id=${id}`);

    // The same with the convenience function, which returns the event id.
    id = await inTransaction(client, async () => {
      await client.query("UPDATE orders SET status = 'paid' WHERE id = $1", [orderId]);
      const res = await client.query('SELECT outbox_publish($1, $2, $3, $4) AS id',
        ['order.paid', orderId, { order_id: orderId }, headers]);
      return res.rows[0].id;
    });
    console.log(`committed order.paid id=${id}`);

    // A failure after the INSERT rolls back the business change and the event: nothing is sent.
    try {
      await inTransaction(client, async () => {
        await client.query("UPDATE orders SET status = 'cancelled' WHERE id = $1", [orderId]);
        const res = await client.query(insertEvent, ['order.cancelled', orderId, { order_id: orderId }, headers]);
        id = res.rows[0].id;
        throw new PaymentDeclined('refund refused by the payment provider');
      });
    } catch (err) {
      if (!(err instanceof PaymentDeclined)) throw err;
      console.log(`rolled back order.cancelled id=${id}: ${err.message}`);
    }
  } finally {
    await client.end();
  }
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
