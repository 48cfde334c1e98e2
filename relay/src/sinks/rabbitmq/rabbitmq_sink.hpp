#pragma once
// type: rabbitmq. Publishes events over one AMQP 0-9-1 connection (rabbitmq-c) with publisher
// confirms, and counts an event as delivered only when the broker confirmed it (basic.ack).
//
// Message: exchange and routing key from the config's templates, mandatory flag set, body = the
// payload's JSON text; properties: content_type application/json, delivery_mode 2 (persistent),
// message_id = the event id, timestamp = created_at (seconds), app_id outbox-relay; headers
// table: outbox-id, outbox-topic, outbox-key, outbox-created-at, then the row's headers.
//
// One channel. Per-key order (key_order confirm, the default): a key's events are published one
// after another, the next only after the broker confirmed the one before (basic.ack; or a
// return, dead-lettered); different keys are in flight together, up to max_in_flight publishes
// without a confirm. So a basic.nack (a queue with x-overflow reject-publish that was full, a
// queue process that crashed) can never let a later message of the key into a queue before the
// earlier one: after a retriable failure of a key, its later events in the batch are not
// published (kDeferred). key_order channel publishes a key's events back to back, in id order
// (RabbitMQ keeps one channel's order in each queue), and relies on the loop's rule
// (core/key_holds.hpp) for an event confirmed after an earlier one of its key failed: a basic.nack
// can then put a later message of the key in a queue first.
//
// Pipelined (Sink::pipelined()): submit() publishes the first event of each key of a batch and
// returns; collect() reads confirms, returns and errors (delivery tags count the publishes of
// every submission on the channel) until every event of the oldest submission has an outcome or
// timeout passes, publishing the next event of a key once the one before is confirmed, and the
// later submissions' ready events meanwhile. The loop never has a key's events in two batches in
// the sink at once (Sink::submit()). See docs/sinks.md "rabbitmq sink" for what is permanent.
#include <memory>
#include <string>

#include "core/sink.hpp"
#include "sinks/rabbitmq/rabbitmq_config.hpp"

namespace outbox::sinks {

// Tries to connect once (bounded by timeout); an unreachable broker is not an error here:
// usable() stays false and the sink reconnects in the background and at the next batch.
// submit(): publishes what may go now of the batch (connecting first if needed; when it cannot,
// the batch's events retry at collect()). collect(): the oldest submission's outcomes, once each
// of its events has one, or about timeout after its submit(): a submission without every confirm
// then, or a lost connection, retries its unconfirmed events, and every other submission's too
// (the connection is replaced, so no late confirm is read as another publish's). A watchdog shuts
// the socket down if a send or read outlives timeout; a reconnect under way in the background may
// add about timeout more. Never throws for broker failures. publish(): submit() then collect().
// usable(): true while a connection with a confirm-mode channel is up. Thread-safe, lock-free.
std::unique_ptr<Sink> make_rabbitmq_sink(std::string name, RabbitmqSinkConfig config);

}  // namespace outbox::sinks
