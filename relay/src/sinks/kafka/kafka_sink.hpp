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
//   statistics.interval.ms=1000 (default; feeds usable()), and
//   topic.metadata.propagation.max.ms <= delivery_timeout / 2 (default; so a missing topic is
//   reported within the batch instead of running into the deadline).
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "core/sink.hpp"
#include "sinks/kafka/kafka_config.hpp"

namespace outbox::sinks {

class KafkaSink final : public NamedSink {
 public:
  // Creates the producer; it connects in the background. Throws config::ConfigError naming
  // config.key_path if librdkafka rejects the configuration. Unreachable brokers are not an
  // error here: usable() stays false until a broker answers.
  KafkaSink(std::string name, KafkaSinkConfig config);
  ~KafkaSink() override;

  // Produces the whole batch, then serves delivery reports until every event has an outcome or
  // delivery_timeout passes (undecided events: kRetry). Blocks at most about delivery_timeout.
  // A fatal producer error fails the whole batch with kRetry and replaces the producer.
  std::vector<Outcome> publish(std::span<const Event* const> events) override;
  // True while the producer is healthy and a broker connection is up (from librdkafka's
  // statistics, refreshed every second, also between batches). Thread-safe, lock-free.
  bool usable() const override;
  // Waits up to timeout for messages still queued in librdkafka (only late copies of events
  // already reported kRetry can be there: publish() never returns with its own events pending).
  void flush(std::chrono::milliseconds timeout) override;

  // How often the producer was replaced (fatal error, or a batch that missed its deadline).
  std::uint64_t producer_replacements() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::sinks
