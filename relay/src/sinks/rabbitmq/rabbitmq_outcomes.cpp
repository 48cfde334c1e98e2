#include "sinks/rabbitmq/rabbitmq_outcomes.hpp"

namespace outbox::sinks {
namespace {

// The reply codes of AMQP 0-9-1 (amqp_framing.h defines them as macros; an enum lets the
// compiler check that the switch below decides every one of them).
enum class AmqpReply : int {
  kSuccess = 200,
  kContentTooLarge = 311,
  kNoRoute = 312,
  kNoConsumers = 313,
  kConnectionForced = 320,
  kInvalidPath = 402,
  kAccessRefused = 403,
  kNotFound = 404,
  kResourceLocked = 405,
  kPreconditionFailed = 406,
  kFrameError = 501,
  kSyntaxError = 502,
  kCommandInvalid = 503,
  kChannelError = 504,
  kUnexpectedFrame = 505,
  kResourceError = 506,
  kNotAllowed = 530,
  kNotImplemented = 540,
  kInternalError = 541,
};

}  // namespace

AmqpErrorClass classify_amqp_reply(int code, bool settled) {
  // Exhaustive over the spec's reply codes, with no default: adding a code to the enum fails the
  // build (-Wswitch, -Werror) until someone decides what it means.
  switch (static_cast<AmqpReply>(code)) {
    // The event itself cannot be published as it is: re-sending it unchanged cannot succeed.
    case AmqpReply::kContentTooLarge:     // the message exceeds what the broker accepts
    case AmqpReply::kAccessRefused:       // the user may not write to this exchange
    case AmqpReply::kPreconditionFailed:  // RabbitMQ: message larger than max_message_size
      return AmqpErrorClass::kPermanent;

    // The topology the event needs is not there: permanent once the broker has settled.
    case AmqpReply::kNoRoute:   // mandatory message, no queue bound for its routing key
    case AmqpReply::kNotFound:  // the exchange the template names does not exist
      return settled ? AmqpErrorClass::kPermanent : AmqpErrorClass::kRetry;

    // Transient, or a broker/connection condition that is not this event's fault (an operator
    // fixes it without touching the row). Retry with backoff; max_attempts still dead-letters.
    case AmqpReply::kSuccess:
    case AmqpReply::kNoConsumers:  // only for the immediate flag, which the sink never sets
    case AmqpReply::kConnectionForced:
    case AmqpReply::kInvalidPath:
    case AmqpReply::kResourceLocked:
    case AmqpReply::kFrameError:
    case AmqpReply::kSyntaxError:
    case AmqpReply::kCommandInvalid:
    case AmqpReply::kChannelError:
    case AmqpReply::kUnexpectedFrame:
    case AmqpReply::kResourceError:
    case AmqpReply::kNotAllowed:
    case AmqpReply::kNotImplemented:
    case AmqpReply::kInternalError: return AmqpErrorClass::kRetry;
  }
  return AmqpErrorClass::kRetry;  // a code off the wire that the spec does not list
}

const char* amqp_reply_name(int code) {
  switch (static_cast<AmqpReply>(code)) {
    case AmqpReply::kSuccess: return "REPLY_SUCCESS";
    case AmqpReply::kContentTooLarge: return "CONTENT_TOO_LARGE";
    case AmqpReply::kNoRoute: return "NO_ROUTE";
    case AmqpReply::kNoConsumers: return "NO_CONSUMERS";
    case AmqpReply::kConnectionForced: return "CONNECTION_FORCED";
    case AmqpReply::kInvalidPath: return "INVALID_PATH";
    case AmqpReply::kAccessRefused: return "ACCESS_REFUSED";
    case AmqpReply::kNotFound: return "NOT_FOUND";
    case AmqpReply::kResourceLocked: return "RESOURCE_LOCKED";
    case AmqpReply::kPreconditionFailed: return "PRECONDITION_FAILED";
    case AmqpReply::kFrameError: return "FRAME_ERROR";
    case AmqpReply::kSyntaxError: return "SYNTAX_ERROR";
    case AmqpReply::kCommandInvalid: return "COMMAND_INVALID";
    case AmqpReply::kChannelError: return "CHANNEL_ERROR";
    case AmqpReply::kUnexpectedFrame: return "UNEXPECTED_FRAME";
    case AmqpReply::kResourceError: return "RESOURCE_ERROR";
    case AmqpReply::kNotAllowed: return "NOT_ALLOWED";
    case AmqpReply::kNotImplemented: return "NOT_IMPLEMENTED";
    case AmqpReply::kInternalError: return "INTERNAL_ERROR";
  }
  return "REPLY_UNKNOWN";
}

}  // namespace outbox::sinks
