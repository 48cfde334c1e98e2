#pragma once
// Pure decisions of the Kafka sink, kept apart from librdkafka so they are table-tested:
// what a librdkafka error code means for an event, and per-key order within a batch.
#include <span>
#include <vector>

#include "core/event.hpp"
#include "core/sink.hpp"

namespace outbox::sinks {

enum class KafkaErrorClass {
  kRetry,      // transient, unknown, or not the event's fault: retry with backoff
  kPermanent,  // this event can never be produced as it is: dead-letter
  kFatal,      // the producer instance is unusable: replace it, mark nothing delivered
};

// code is an rd_kafka_resp_err_t value (from produce() or a delivery report; never NO_ERROR).
// topic_auto_create says whether the producer asks the broker to create missing topics
// (librdkafka's allow.auto.create.topics, true by default for producers): only when it is off
// is an unknown topic permanent. Unknown codes retry: only the listed codes are permanent.
KafkaErrorClass classify_kafka_error(int code, bool topic_auto_create);

// Per-key order within one batch. Once an event of key K has an outcome kRetry or kDeferred,
// no later event of K in the batch may count as delivered ahead of it: a later kDelivered of K
// becomes kRetry, so the row is re-sent after the earlier one succeeds (a duplicate in Kafka,
// never a row marked done out of order in the outbox). kPermanent does not hold a key back:
// a dead-lettered event releases its key (DESIGN §4). outcomes[i] belongs to events[i].
void hold_back_after_failures(std::span<const Event* const> events, std::vector<Outcome>& outcomes);

}  // namespace outbox::sinks
