// Error classification and per-key order of the Kafka sink: pure functions, table-tested.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>

#include "sinks/kafka/kafka_outcomes.hpp"
#include "sinks/kafka/rdkafka.hpp"

using namespace outbox;
using sinks::classify_kafka_error;
using sinks::KafkaErrorClass;

namespace {

// The only codes that are not kRetry. Everything librdkafka knows that is not listed here must
// classify as kRetry (checked below over librdkafka's full error table).
struct Row {
  rd_kafka_resp_err_t code;
  KafkaErrorClass with_auto_create;
  KafkaErrorClass without_auto_create;
};
const std::vector<Row> kNotRetry{
    {RD_KAFKA_RESP_ERR_MSG_SIZE_TOO_LARGE, KafkaErrorClass::kPermanent, KafkaErrorClass::kPermanent},
    {RD_KAFKA_RESP_ERR_INVALID_MSG, KafkaErrorClass::kPermanent, KafkaErrorClass::kPermanent},
    {RD_KAFKA_RESP_ERR_INVALID_MSG_SIZE, KafkaErrorClass::kPermanent, KafkaErrorClass::kPermanent},
    {RD_KAFKA_RESP_ERR_INVALID_RECORD, KafkaErrorClass::kPermanent, KafkaErrorClass::kPermanent},
    {RD_KAFKA_RESP_ERR__BAD_MSG, KafkaErrorClass::kPermanent, KafkaErrorClass::kPermanent},
    {RD_KAFKA_RESP_ERR_TOPIC_EXCEPTION, KafkaErrorClass::kPermanent, KafkaErrorClass::kPermanent},
    {RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED, KafkaErrorClass::kPermanent, KafkaErrorClass::kPermanent},
    {RD_KAFKA_RESP_ERR_UNKNOWN_TOPIC_OR_PART, KafkaErrorClass::kRetry, KafkaErrorClass::kPermanent},
    {RD_KAFKA_RESP_ERR__UNKNOWN_TOPIC, KafkaErrorClass::kRetry, KafkaErrorClass::kPermanent},
    {RD_KAFKA_RESP_ERR__FATAL, KafkaErrorClass::kFatal, KafkaErrorClass::kFatal},
};

const char* name(KafkaErrorClass c) {
  switch (c) {
    case KafkaErrorClass::kRetry: return "retry";
    case KafkaErrorClass::kPermanent: return "permanent";
    case KafkaErrorClass::kFatal: return "fatal";
  }
  return "?";
}

}  // namespace

TEST_CASE("kafka: the listed codes are permanent or fatal, as the table says") {
  for (const auto& row : kNotRetry) {
    CAPTURE(rd_kafka_err2name(row.code));
    CHECK(name(classify_kafka_error(row.code, true)) == std::string(name(row.with_auto_create)));
    CHECK(name(classify_kafka_error(row.code, false)) == std::string(name(row.without_auto_create)));
  }
}

TEST_CASE("kafka: every other code librdkafka knows retries, with and without topic auto-creation") {
  std::set<int> listed;
  for (const auto& row : kNotRetry) listed.insert(row.code);
  const rd_kafka_err_desc* descs = nullptr;
  size_t count = 0;
  rd_kafka_get_err_descs(&descs, &count);
  REQUIRE(count > 100);
  std::size_t checked = 0;
  for (size_t i = 0; i < count; ++i) {
    if (!descs[i].name) continue;  // holes in librdkafka's table
    if (listed.count(descs[i].code)) continue;
    CAPTURE(descs[i].name);
    CHECK(classify_kafka_error(descs[i].code, true) == KafkaErrorClass::kRetry);
    CHECK(classify_kafka_error(descs[i].code, false) == KafkaErrorClass::kRetry);
    ++checked;
  }
  // librdkafka 2.0.2 names 150+ codes; the table above covers the rest.
  CHECK(checked + listed.size() > 150);
  // Transient ones an operator meets most, spelled out.
  for (auto code : {RD_KAFKA_RESP_ERR__MSG_TIMED_OUT, RD_KAFKA_RESP_ERR__TRANSPORT, RD_KAFKA_RESP_ERR__ALL_BROKERS_DOWN,
                    RD_KAFKA_RESP_ERR__QUEUE_FULL, RD_KAFKA_RESP_ERR__PURGE_QUEUE, RD_KAFKA_RESP_ERR__PURGE_INFLIGHT,
                    RD_KAFKA_RESP_ERR_NOT_LEADER_FOR_PARTITION, RD_KAFKA_RESP_ERR_NOT_ENOUGH_REPLICAS,
                    RD_KAFKA_RESP_ERR_REQUEST_TIMED_OUT, RD_KAFKA_RESP_ERR_LEADER_NOT_AVAILABLE,
                    RD_KAFKA_RESP_ERR_OUT_OF_ORDER_SEQUENCE_NUMBER, RD_KAFKA_RESP_ERR_CLUSTER_AUTHORIZATION_FAILED}) {
    CAPTURE(rd_kafka_err2name(code));
    CHECK(classify_kafka_error(code, false) == KafkaErrorClass::kRetry);
  }
}

TEST_CASE("kafka: codes librdkafka does not know retry") {
  CHECK(classify_kafka_error(12345, false) == KafkaErrorClass::kRetry);
  CHECK(classify_kafka_error(-12345, false) == KafkaErrorClass::kRetry);
  CHECK(classify_kafka_error(RD_KAFKA_RESP_ERR_END_ALL, false) == KafkaErrorClass::kRetry);
}

namespace {

struct Batch {
  std::vector<Event> events;
  std::vector<const Event*> pointers;
  explicit Batch(const std::vector<std::string>& keys) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      Event e;
      e.id = static_cast<EventId>(i + 1);
      e.key = keys[i];
      events.push_back(e);
    }
    for (const auto& e : events) pointers.push_back(&e);
  }
};

std::string kinds(const std::vector<Outcome>& outcomes) {
  std::string out;
  for (const auto& o : outcomes) {
    switch (o.kind) {
      case OutcomeKind::kDelivered: out += 'D'; break;
      case OutcomeKind::kRetry: out += 'R'; break;
      case OutcomeKind::kPermanent: out += 'P'; break;
      case OutcomeKind::kDeferred: out += 'F'; break;
    }
  }
  return out;
}

std::vector<Outcome> outcomes_of(const std::string& kinds_text) {
  std::vector<Outcome> out;
  for (char c : kinds_text) {
    switch (c) {
      case 'D': out.push_back(Outcome::delivered()); break;
      case 'R': out.push_back(Outcome::retry("r")); break;
      case 'P': out.push_back(Outcome::permanent("p")); break;
      case 'F': out.push_back(Outcome::deferred()); break;
    }
  }
  return out;
}

}  // namespace

TEST_CASE("kafka: a later delivered event of a key that must retry is not counted as delivered") {
  struct Case {
    std::vector<std::string> keys;
    std::string in;
    std::string out;
  };
  const std::vector<Case> cases{
      {{"a", "a", "a"}, "DDD", "DDD"},
      {{"a", "a", "a"}, "RDD", "RRR"},  // a retry holds back every later event of its key
      {{"a", "b", "a", "b"}, "RDDD", "RDRD"},  // other keys flow
      {{"a", "a", "a"}, "DRD", "DRR"},  // earlier deliveries stand
      {{"a", "a"}, "FD", "FR"},  // deferred holds the key too
      {{"a", "a", "a"}, "PDD", "PDD"},  // a dead letter releases its key
      {{"a", "a", "a"}, "RPD", "RPR"},  // a permanent outcome stays permanent
      {{"a", "b", "c"}, "RRR", "RRR"},
      {{}, "", ""},
  };
  for (const auto& c : cases) {
    Batch batch(c.keys);
    auto outcomes = outcomes_of(c.in);
    sinks::hold_back_after_failures(batch.pointers, outcomes);
    CAPTURE(c.in);
    CHECK(kinds(outcomes) == c.out);
  }
  Batch batch({"a", "a"});
  auto outcomes = outcomes_of("RD");
  sinks::hold_back_after_failures(batch.pointers, outcomes);
  CHECK(outcomes[1].reason.find("earlier event of the same key") != std::string::npos);
}
