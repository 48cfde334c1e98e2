// Error classification of the NATS sink: a pure function, table-tested.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "sinks/nats/cnats.hpp"
#include "sinks/nats/nats_outcomes.hpp"

using namespace outbox;
using sinks::classify_nats_error;
using sinks::NatsErrorClass;

namespace {

const char* name(NatsErrorClass c) {
  switch (c) {
    case NatsErrorClass::kRetry: return "retry";
    case NatsErrorClass::kPermanent: return "permanent";
  }
  return "?";
}

// The only failures that are not kRetry (with no_stream: retry). Everything else nats.c knows
// must classify as kRetry (checked below over the whole natsStatus and jsErrCode ranges).
struct Row {
  natsStatus status;
  int js_code;
  NatsErrorClass expected;
};
const std::vector<Row> kPermanent{
    {NATS_ERR, JSStreamMessageExceedsMaximumErr, NatsErrorClass::kPermanent},  // stream max_msg_size
    {NATS_ERR, JSStreamSealedErr, NatsErrorClass::kPermanent},
    {NATS_MAX_PAYLOAD, 0, NatsErrorClass::kPermanent},  // server max_payload, checked by the client
    {NATS_INVALID_SUBJECT, 0, NatsErrorClass::kPermanent},
    {NATS_NOT_PERMITTED, 0, NatsErrorClass::kPermanent},
};

bool listed(natsStatus status, int js_code) {
  for (const auto& row : kPermanent) {
    if (row.status == status && (row.js_code == js_code || (row.js_code == 0 && status != NATS_ERR))) return true;
  }
  return false;
}

}  // namespace

TEST_CASE("nats outcomes: the permanent table") {
  for (const auto& row : kPermanent) {
    CAPTURE(row.status);
    CAPTURE(row.js_code);
    CHECK(name(classify_nats_error(row.status, row.js_code, false)) == std::string(name(row.expected)));
    CHECK(name(classify_nats_error(row.status, row.js_code, true)) == std::string(name(row.expected)));
  }
}

TEST_CASE("nats outcomes: no responders (no stream captures the subject) follows no_stream") {
  CHECK(classify_nats_error(NATS_NO_RESPONDERS, 0, false) == NatsErrorClass::kRetry);
  CHECK(classify_nats_error(NATS_NO_RESPONDERS, 0, true) == NatsErrorClass::kPermanent);
}

TEST_CASE("nats outcomes: everything else retries, also codes this nats.c does not know") {
  // Every natsStatus but the listed ones and NO_RESPONDERS, with and without no_stream: permanent.
  for (int s = NATS_OK; s <= NATS_MISSED_HEARTBEAT; ++s) {
    const auto status = static_cast<natsStatus>(s);
    if (status == NATS_NO_RESPONDERS || listed(status, 0)) continue;
    CAPTURE(s);
    CHECK(classify_nats_error(status, 0, false) == NatsErrorClass::kRetry);
    CHECK(classify_nats_error(status, 0, true) == NatsErrorClass::kRetry);
  }
  // Every JetStream code in nats.c's range but the listed ones (and gaps in the enum).
  for (int code = 10000; code <= 10200; ++code) {
    if (listed(NATS_ERR, code)) continue;
    CAPTURE(code);
    CHECK(classify_nats_error(NATS_ERR, code, false) == NatsErrorClass::kRetry);
    CHECK(classify_nats_error(NATS_ERR, code, true) == NatsErrorClass::kRetry);
  }
  // Transient cases by name, as operators meet them.
  CHECK(classify_nats_error(NATS_TIMEOUT, 0, true) == NatsErrorClass::kRetry);  // no PubAck in time
  CHECK(classify_nats_error(NATS_CONNECTION_DISCONNECTED, 0, true) == NatsErrorClass::kRetry);
  CHECK(classify_nats_error(NATS_ERR, JSStreamStoreFailedErr, true) == NatsErrorClass::kRetry);  // limits, discard new
  CHECK(classify_nats_error(NATS_ERR, JSClusterNotAvailErr, true) == NatsErrorClass::kRetry);
  CHECK(classify_nats_error(NATS_ERR, 0, true) == NatsErrorClass::kRetry);      // an error without a code
  CHECK(classify_nats_error(9999, 0, true) == NatsErrorClass::kRetry);          // a status from a newer nats.c
  CHECK(classify_nats_error(NATS_ERR, 19999, true) == NatsErrorClass::kRetry);  // a code from a newer server
}
