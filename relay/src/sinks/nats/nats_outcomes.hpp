#pragma once
// A pure decision of the NATS sink, kept apart from the connection so it is table-tested: what a
// failed JetStream publish means for its event.

namespace outbox::sinks {

enum class NatsErrorClass {
  kRetry,      // transient, unknown, or not the event's fault: retry with backoff
  kPermanent,  // this event can never be stored as it is: dead-letter
};

// status is a natsStatus (never NATS_OK): from js_PublishMsgAsync itself or from the PubAck
// (NATS_ERR with a JetStream error code, NATS_NO_RESPONDERS, NATS_TIMEOUT). js_code is the
// JetStream error code of the PubAck (a jsErrCode, 0 when none). no_stream_permanent: the
// sink's no_stream setting, for NATS_NO_RESPONDERS (no stream captures the subject). Unknown
// codes retry: only the listed ones are permanent.
NatsErrorClass classify_nats_error(int status, int js_code, bool no_stream_permanent);

}  // namespace outbox::sinks
