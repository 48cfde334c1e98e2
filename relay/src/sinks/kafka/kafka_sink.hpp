#pragma once
// type: kafka. Publishes events with librdkafka's idempotent producer and counts an event as
// delivered only when its delivery report says so.
//
// Message: key = aggregate_id, value = the payload's JSON text, headers outbox-id,
// outbox-topic, outbox-created-at, then the row's headers in their order. Topic = the
// config's template with {topic} replaced by the row's topic.
//
// Producer settings the sink imposes (see kafka_config.cpp for the ones it refuses):
//   enable.idempotence=true, acks=all (default), message.timeout.ms=0 (infinite; the sink's
//   delivery_timeout bounds a batch instead), partitioner=murmur2_random (default; the Java
//   client's, so the same key lands on the same partition as with Java producers),
//   statistics.interval.ms=1000 (default; feeds usable()), linger.ms=1 (default; a pipelined
//   batch queued behind another is sent within it, not after librdkafka's 5 ms), and
//   topic.metadata.propagation.max.ms <= delivery_timeout / 2 (default; so a missing topic is
//   reported within the batch instead of running into the deadline).
#include <cstdint>
#include <memory>
#include <string>

#include "core/sink.hpp"
#include "sinks/kafka/kafka_config.hpp"

namespace outbox::sinks {

// A Kafka sink: a Sink that also counts its producer replacements (read by tests).
class KafkaSink : public NamedSink {
 public:
  // How often the producer was replaced (fatal error, or a batch that missed its deadline).
  virtual std::uint64_t producer_replacements() const = 0;

 protected:
  using NamedSink::NamedSink;
};

// Creates the producer; it connects in the background. Throws config::ConfigError naming
// config.key_path if librdkafka rejects the configuration. Unreachable brokers are not an
// error here: usable() stays false until a broker answers.
// publish(): produces the whole batch, then serves delivery reports until every event has an
// outcome or delivery_timeout passes (undecided events: kRetry). The sink is pipelined: submit() produces, collect()
// waits for the oldest batch's reports (exactly once: ends the open transaction, which holds every batch submitted
// since the last one ended); publish() is both. Blocks at most
// about delivery_timeout. A fatal producer error fails the whole batch with kRetry and replaces the producer. usable():
// true while the producer is healthy and a broker connection is up (from librdkafka's statistics, refreshed every
// second, also between batches). Thread-safe, lock-free. flush(): waits up to timeout for messages still queued in
// librdkafka (only late copies of events already reported kRetry can be there: publish() never returns with its own
// events pending).
std::unique_ptr<KafkaSink> make_kafka_sink(std::string name, KafkaSinkConfig config);

}  // namespace outbox::sinks
