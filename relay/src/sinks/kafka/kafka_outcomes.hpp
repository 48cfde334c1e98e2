#pragma once
// A pure decision of the Kafka sink, kept apart from librdkafka so it is table-tested: what a
// librdkafka error code means for an event.

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

}  // namespace outbox::sinks
