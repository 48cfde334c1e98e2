#pragma once
// type: rabbitmq. Publishes events over one AMQP 0-9-1 connection (rabbitmq-c) with publisher
// confirms, and counts an event as delivered only when the broker confirmed it (basic.ack).
//
// Message: exchange and routing key from the config's templates, mandatory flag set, body = the
// payload's JSON text; properties: content_type application/json, delivery_mode 2 (persistent),
// message_id = the event id, timestamp = created_at (seconds), app_id outbox-relay; headers
// table: outbox-id, outbox-topic, outbox-key, outbox-created-at, then the row's headers.
//
// One channel, publishes in id order: RabbitMQ keeps the order of one channel's messages in each
// queue they reach. A batch is published pipelined (up to max_in_flight without a confirm),
// then the sink reads confirms, returns and errors until every event has an outcome or timeout
// passes. See docs/sinks.md "rabbitmq sink" for what is permanent and how per-key order holds.
#include <memory>
#include <string>

#include "core/sink.hpp"
#include "sinks/rabbitmq/rabbitmq_config.hpp"

namespace outbox::sinks {

// Tries to connect once (bounded by timeout); an unreachable broker is not an error here:
// usable() stays false and the sink reconnects in the background and at the next batch.
// publish(): publishes the batch and waits for its confirms. Blocks at most about timeout (a
// watchdog shuts the socket down if a send or read outlives it), plus at most about timeout more
// if the background reconnect is under way. Never throws for broker failures.
// usable(): true while a connection with a confirm-mode channel is up. Thread-safe, lock-free.
std::unique_ptr<Sink> make_rabbitmq_sink(std::string name, RabbitmqSinkConfig config);

}  // namespace outbox::sinks
