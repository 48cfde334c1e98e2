#pragma once
// A pure decision of the RabbitMQ sink, kept apart from rabbitmq-c so it is table-tested: what an
// AMQP 0-9-1 reply code means for the event that caused it.

namespace outbox::sinks {

enum class AmqpErrorClass {
  kRetry,      // transient, unknown, or not the event's fault: retry with backoff
  kPermanent,  // this event can never be published as it is: dead-letter
};

// code is the reply code of a basic.return (the broker could not route a mandatory message) or
// of the channel.close that the publish of one event caused (found by publishing the events of
// a failed batch one at a time). Unknown codes retry: only the listed codes are permanent.
AmqpErrorClass classify_amqp_reply(int code);

// The reply code's name from the AMQP 0-9-1 spec (e.g. "NO_ROUTE"), or "REPLY_UNKNOWN".
const char* amqp_reply_name(int code);

}  // namespace outbox::sinks
