// Error classification of the Kafka sink: a pure function, table-tested.
#include <doctest/doctest.h>

#include <map>
#include <set>
#include <string>
#include <vector>

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
