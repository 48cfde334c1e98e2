// The RabbitMQ sink's classification of AMQP reply codes: a table, as docs/sinks.md states it.
#include <doctest/doctest.h>

#include <amqp.h>
#include <amqp_framing.h>

#include <string>

#include "sinks/rabbitmq/rabbitmq_outcomes.hpp"

using outbox::sinks::amqp_reply_name;
using outbox::sinks::AmqpErrorClass;
using outbox::sinks::classify_amqp_reply;

TEST_CASE("rabbitmq outcomes: only the listed reply codes are permanent") {
  struct Row {
    int code;
    const char* name;
    AmqpErrorClass expected;  // on a settled connection
  };
  const Row table[] = {
      // The event cannot be published as it is.
      {AMQP_CONTENT_TOO_LARGE, "CONTENT_TOO_LARGE", AmqpErrorClass::kPermanent},
      {AMQP_NO_ROUTE, "NO_ROUTE", AmqpErrorClass::kPermanent},
      {AMQP_ACCESS_REFUSED, "ACCESS_REFUSED", AmqpErrorClass::kPermanent},
      {AMQP_NOT_FOUND, "NOT_FOUND", AmqpErrorClass::kPermanent},
      {AMQP_PRECONDITION_FAILED, "PRECONDITION_FAILED", AmqpErrorClass::kPermanent},
      // Transient or not the event's fault.
      {AMQP_REPLY_SUCCESS, "REPLY_SUCCESS", AmqpErrorClass::kRetry},
      {AMQP_NO_CONSUMERS, "NO_CONSUMERS", AmqpErrorClass::kRetry},
      {AMQP_CONNECTION_FORCED, "CONNECTION_FORCED", AmqpErrorClass::kRetry},
      {AMQP_INVALID_PATH, "INVALID_PATH", AmqpErrorClass::kRetry},
      {AMQP_RESOURCE_LOCKED, "RESOURCE_LOCKED", AmqpErrorClass::kRetry},
      {AMQP_FRAME_ERROR, "FRAME_ERROR", AmqpErrorClass::kRetry},
      {AMQP_SYNTAX_ERROR, "SYNTAX_ERROR", AmqpErrorClass::kRetry},
      {AMQP_COMMAND_INVALID, "COMMAND_INVALID", AmqpErrorClass::kRetry},
      {AMQP_CHANNEL_ERROR, "CHANNEL_ERROR", AmqpErrorClass::kRetry},
      {AMQP_UNEXPECTED_FRAME, "UNEXPECTED_FRAME", AmqpErrorClass::kRetry},
      {AMQP_RESOURCE_ERROR, "RESOURCE_ERROR", AmqpErrorClass::kRetry},
      {AMQP_NOT_ALLOWED, "NOT_ALLOWED", AmqpErrorClass::kRetry},
      {AMQP_NOT_IMPLEMENTED, "NOT_IMPLEMENTED", AmqpErrorClass::kRetry},
      {AMQP_INTERNAL_ERROR, "INTERNAL_ERROR", AmqpErrorClass::kRetry},
  };
  for (const auto& row : table) {
    CAPTURE(row.code);
    CHECK(classify_amqp_reply(row.code, true) == row.expected);
    CHECK(std::string(amqp_reply_name(row.code)) == row.name);
    // Before the broker has settled, a missing route or exchange retries (a restarted node may
    // still be recovering them); nothing else changes.
    const bool topology = row.code == AMQP_NO_ROUTE || row.code == AMQP_NOT_FOUND;
    CHECK(classify_amqp_reply(row.code, false) == (topology ? AmqpErrorClass::kRetry : row.expected));
  }
  // A code off the wire that the spec does not list retries.
  CHECK(classify_amqp_reply(0, true) == AmqpErrorClass::kRetry);
  CHECK(classify_amqp_reply(999, true) == AmqpErrorClass::kRetry);
  CHECK(std::string(amqp_reply_name(999)) == "REPLY_UNKNOWN");
}
