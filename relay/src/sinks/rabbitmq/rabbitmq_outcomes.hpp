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
// settled: the broker has been reachable without a loss for at least the sink's recovery_grace.
// NO_ROUTE and NOT_FOUND say that the queue, binding or exchange the message needs is not there,
// which is permanent on a settled connection but not right after a (re)start of the broker or of
// the operator's topology (a node that has just started may still be bringing its durable queues
// and bindings back, a consumer may not have declared its queue yet): before that they retry.
AmqpErrorClass classify_amqp_reply(int code, bool settled);

// The reply code's name from the AMQP 0-9-1 spec (e.g. "NO_ROUTE"), or "REPLY_UNKNOWN".
const char* amqp_reply_name(int code);

}  // namespace outbox::sinks
