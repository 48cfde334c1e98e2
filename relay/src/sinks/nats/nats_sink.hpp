#pragma once
// type: nats. Publishes events to NATS JetStream with asynchronous publishes and counts an event
// as delivered only when its PubAck (the stream stored it, or already had it) arrives.
//
// Message: subject = the config's template with {topic} replaced by the row's topic, data = the
// payload's JSON text, headers Nats-Msg-Id = the event id (JetStream drops a re-send of an id it
// stored within the stream's duplicate window), outbox-id, outbox-topic, outbox-created-at, then
// the row's headers in their order (a row's Nats-* header is dropped with a warning: those steer
// JetStream).
//
// Per-key order: events of one key are published one after another, the next only after the
// PubAck of the one before; different keys are in flight together, up to max_in_flight. After a
// retriable failure of a key (or no PubAck within timeout), the key's later events in the batch
// are not published (kDeferred). A permanent failure dead-letters the event and releases its key.
//
// Pipelined (Sink::pipelined()): submit() publishes the first event of each key of a batch and
// returns; collect() waits for the PubAcks of the oldest batch, publishing the next event of a key
// as the one before it is acknowledged (and the later batches' ready events meanwhile, within
// max_in_flight for all of them). The loop never has a key's events in two batches in the sink at
// once (Sink::submit()), so the rule above, per batch, is per key. Nats-Msg-Id stays the event id.
#include <memory>
#include <string>

#include "core/sink.hpp"
#include "sinks/nats/nats_config.hpp"

namespace outbox::sinks {

// Creates the connection; it connects (and reconnects, forever) in the background. A server
// that cannot be reached is not an error here: usable() stays false until it answers. Throws
// config::ConfigError naming config.key_path if nats.c rejects the settings.
// submit(): publishes what may go now of the batch (nothing, when not connected: its events then
// retry at collect()). collect(): the oldest submission's outcomes, after its PubAcks or about
// config.timeout from its submit(); events without one then retry, and nats.c no longer holds
// any of its messages (those of later submissions it held are published again). publish():
// submit() then collect().
// usable(): true while the connection to a server is up. Thread-safe, lock-free.
// flush(): flushes the connection's write buffer (the loop collects every submission first).
std::unique_ptr<Sink> make_nats_sink(std::string name, NatsSinkConfig config);

}  // namespace outbox::sinks
