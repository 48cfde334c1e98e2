//! Commits an order and its events through the transactional outbox (tokio-postgres).
//!
//! Usage: `DATABASE_URL=postgresql://... [TRACEPARENT=00-...] outbox-writer-example ORDER_ID`

use std::error::Error;
use std::io::Read;

use serde_json::{json, Map, Value};
use tokio_postgres::{Client, NoTls};

const INSERT_EVENT: &str = "INSERT INTO outbox_events (topic, aggregate_id, payload, headers) \
                            VALUES ($1, $2, $3, $4) RETURNING id";

/// The caller's W3C trace context (TRACEPARENT/TRACESTATE, as OpenTelemetry passes it to a
/// process), or a new trace. In a service, inject the current span's context here instead.
fn trace_headers() -> Result<Value, Box<dyn Error>> {
    let traceparent = match std::env::var("TRACEPARENT") {
        Ok(tp) if !tp.is_empty() => tp,
        _ => format!("00-{}-{}-01", random_hex(16)?, random_hex(8)?),
    };
    let mut headers = Map::new();
    headers.insert("traceparent".into(), traceparent.into());
    if let Ok(ts) = std::env::var("TRACESTATE") {
        if !ts.is_empty() {
            headers.insert("tracestate".into(), ts.into());
        }
    }
    Ok(Value::Object(headers))
}

fn random_hex(bytes: usize) -> std::io::Result<String> {
    let mut buf = vec![0u8; bytes];
    std::fs::File::open("/dev/urandom")?.read_exact(&mut buf)?;
    Ok(buf.iter().map(|b| format!("{b:02x}")).collect())
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn Error>> {
    let order_id = match std::env::args().nth(1) {
        Some(id) => id,
        None => format!("order-{}", random_hex(4)?),
    };
    let headers = trace_headers()?;
    let url = std::env::var("DATABASE_URL").map_err(|_| "set DATABASE_URL")?;
    let (mut client, connection) = tokio_postgres::connect(&url, NoTls).await?;
    let conn_task = tokio::spawn(connection);
    client
        .batch_execute(
            "CREATE TABLE IF NOT EXISTS orders (id text PRIMARY KEY, status text NOT NULL, \
             amount_cents integer NOT NULL)",
        )
        .await?;

    // One transaction: the business row and its event commit together or not at all.
    // A Transaction dropped without commit() rolls back.
    let tx = client.transaction().await?;
    tx.execute(
        "INSERT INTO orders (id, status, amount_cents) VALUES ($1, 'placed', 1999)",
        &[&order_id],
    )
    .await?;
    let payload = json!({"order_id": order_id, "amount_cents": 1999});
    let id: i64 = tx
        .query_one(INSERT_EVENT, &[&"order.placed", &order_id, &payload, &headers])
        .await?
        .get(0);
    tx.commit().await?;
    println!("committed order.placed id={id}");

    // The same with the convenience function, which returns the event id.
    let tx = client.transaction().await?;
    tx.execute("UPDATE orders SET status = 'paid' WHERE id = $1", &[&order_id])
        .await?;
    let payload = json!({"order_id": order_id});
    let id: i64 = tx
        .query_one(
            "SELECT outbox_publish($1, $2, $3, $4)",
            &[&"order.paid", &order_id, &payload, &headers],
        )
        .await?
        .get(0);
    tx.commit().await?;
    println!("committed order.paid id={id}");

    // A failure after the INSERT rolls back the business change and the event: nothing is sent.
    match cancel_order(&mut client, &order_id, &headers).await {
        Err(CancelError::PaymentDeclined(id)) => println!(
            "rolled back order.cancelled id={id}: refund refused by the payment provider"
        ),
        Err(CancelError::Db(e)) => return Err(e.into()),
        Ok(()) => return Err("the cancellation was expected to fail".into()),
    }

    drop(client);
    conn_task.await??;
    Ok(())
}

enum CancelError {
    /// The id the event had in the rolled-back transaction.
    PaymentDeclined(i64),
    Db(tokio_postgres::Error),
}

impl From<tokio_postgres::Error> for CancelError {
    fn from(e: tokio_postgres::Error) -> Self {
        CancelError::Db(e)
    }
}

async fn cancel_order(client: &mut Client, order_id: &str, headers: &Value) -> Result<(), CancelError> {
    let tx = client.transaction().await?;
    tx.execute("UPDATE orders SET status = 'cancelled' WHERE id = $1", &[&order_id])
        .await?;
    let payload = json!({"order_id": order_id});
    let id: i64 = tx
        .query_one(INSERT_EVENT, &[&"order.cancelled", &order_id, &payload, headers])
        .await?
        .get(0);
    // The payment provider refuses: roll back (a Transaction dropped without commit() would too).
    tx.rollback().await?;
    Err(CancelError::PaymentDeclined(id))
}
