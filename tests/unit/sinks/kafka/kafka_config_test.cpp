// Parsing and describing `type: kafka` sink entries.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "app/run.hpp"
#include "config/config.hpp"
#include "log/log.hpp"
#include "sinks/kafka/kafka_config.hpp"
#include "sinks/kafka/kafka_sink.hpp"
#include "sinks/registry.hpp"
#include "support/env.hpp"
#include "support/sinks.hpp"

using namespace outbox;
using config::ConfigError;

namespace {

using outbox::testing::env_of;

const outbox::testing::OneSink<sinks::KafkaSinkConfig> entry{"k", "kafka", sinks::parse_kafka_sink};

}  // namespace

TEST_CASE("kafka config: defaults and every key") {
  const auto c = entry.config("    brokers: 'b1:9092, b2:9093'\n");
  const auto k = outbox::testing::sink_settings(c, 0, sinks::parse_kafka_sink);
  CHECK(k.brokers == "b1:9092, b2:9093");
  CHECK(k.topic == "{topic}");
  CHECK(k.delivery_timeout == std::chrono::seconds{5});
  CHECK(k.properties.empty());
  CHECK(k.key_path == "sinks[0]");

  const auto full = entry.config(
      "    brokers: ${KAFKA}\n"
      "    topic: 'outbox.{topic}.v1'\n"
      "    delivery_timeout: 5s\n"
      "    properties: {compression.type: zstd, linger.ms: 20, sasl.password: '${PW}'}\n",
      env_of({{"KAFKA", "127.0.0.1:9092"}, {"PW", "hunter2-secret"}}));
  const auto f = outbox::testing::sink_settings(full, 0, sinks::parse_kafka_sink);
  CHECK(f.brokers == "127.0.0.1:9092");
  CHECK(f.topic == "outbox.{topic}.v1");
  CHECK(f.delivery_timeout == std::chrono::seconds{5});
  CHECK(f.properties.at("compression.type") == "zstd");
  CHECK(f.properties.at("linger.ms") == "20");
  CHECK(f.properties.at("sasl.password") == "hunter2-secret");
}

TEST_CASE("kafka config: secrets are masked in describe() and in every log line") {
  const auto c = entry.config(
      "    brokers: 'b:9092'\n"
      "    properties: {sasl.username: relay, sasl.password: 's3cr3t-kafka-pw', ssl.key.password: 'key-pw-1234'}\n");
  const auto described = outbox::testing::describe_with_sinks(c).dump();
  CHECK(described.find("s3cr3t-kafka-pw") == std::string::npos);
  CHECK(described.find("key-pw-1234") == std::string::npos);
  const auto j = outbox::testing::describe_with_sinks(c)["sinks"][0];
  CHECK(j["type"] == "kafka");
  CHECK(j["brokers"] == "b:9092");
  CHECK(j["properties"]["sasl.password"] == "*****");
  CHECK(j["properties"]["ssl.key.password"] == "*****");
  CHECK(j["properties"]["sasl.username"] == "relay");
  CHECK(log::redact("auth with s3cr3t-kafka-pw failed") == "auth with ***** failed");
  CHECK(sinks::is_secret_kafka_property("sasl.oauthbearer.client.secret"));
  CHECK(sinks::is_secret_kafka_property("ssl.keystore.password"));
  CHECK(sinks::is_secret_kafka_property("ssl.key.pem"));
  CHECK_FALSE(sinks::is_secret_kafka_property("ssl.ca.location"));
}

TEST_CASE("kafka config: errors name the key and what was expected") {
  CHECK(entry.error_of("    topic: x\n") == "sinks[0].brokers: required, but missing");
  CHECK(entry.error_of("    brokers: 'a:1,,b:2'\n").find("sinks[0].brokers: expected host:port") == 0);
  CHECK(entry.error_of("    brokers: 'a b:1'\n").find("sinks[0].brokers: expected host:port") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    topic: 'events.{name}'\n").find("sinks[0].topic: unexpected '{'") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    topic: 'events/{topic}'\n").find("sinks[0].topic: unexpected '/'") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    topic: ''\n").find("sinks[0].topic:") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    topic: '..'\n").find("sinks[0].topic: '..' is not a valid Kafka topic") ==
        0);
  CHECK(entry.error_of("    brokers: b:1\n    delivery_timeout: 10ms\n") ==
        "sinks[0].delivery_timeout: expected 100ms to 1h, got 10ms");
  CHECK(entry.error_of("    brokers: b:1\n    properties: {no.such.property: 1}\n")
            .find("sinks[0].properties.no.such.property: No such configuration property") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    properties: {compression.type: bogus}\n")
            .find("sinks[0].properties.compression.type: Invalid value") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    properties: {enable.idempotence: 'false'}\n")
            .find("sinks[0].properties.enable.idempotence: must be true") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    properties: {bootstrap.servers: 'x:1'}\n")
            .find("sinks[0].properties.bootstrap.servers: not allowed here") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    properties: {message.timeout.ms: 1000}\n")
            .find("sinks[0].properties.message.timeout.ms: not allowed here") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    properties: {transactional.id: t}\n")
            .find("sinks[0].properties.transactional.id: not allowed here") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    propertys: {}\n").find("sinks[0].propertys: unknown key") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    properties: [a]\n") ==
        "sinks[0].properties: expected a mapping of strings");
}

TEST_CASE("kafka config: exactly_once and its keys") {
  const auto plain = outbox::testing::sink_settings(entry.config("    brokers: b:1\n"), 0, sinks::parse_kafka_sink);
  CHECK_FALSE(plain.exactly_once);
  const auto c = entry.config("    brokers: b:1\n    exactly_once: true\n");
  const auto k = outbox::testing::sink_settings(c, 0, sinks::parse_kafka_sink);
  CHECK(k.exactly_once);
  CHECK(sinks::effective_transactional_id(k, "orders") == "outbox-relay.orders");
  CHECK(sinks::effective_progress_topic(k, "orders") == "outbox-relay.orders.progress");
  CHECK(sinks::effective_transaction_timeout(k) == std::chrono::seconds{10});
  const auto full =
      outbox::testing::sink_settings(entry.config("    brokers: b:1\n    exactly_once: true\n    delivery_timeout: 8s\n"
                                                  "    transactional_id: tx.orders\n    progress_topic: p.orders\n"),
                                     0, sinks::parse_kafka_sink);
  CHECK(sinks::effective_transactional_id(full, "orders") == "tx.orders");
  CHECK(sinks::effective_progress_topic(full, "orders") == "p.orders");
  CHECK(sinks::effective_transaction_timeout(full) == std::chrono::seconds{16});
  CHECK(outbox::testing::describe_with_sinks(c)["sinks"][0]["exactly_once"] == true);

  CHECK(entry.error_of("    brokers: b:1\n    transactional_id: t\n") ==
        "sinks[0].transactional_id: only with exactly_once: true");
  CHECK(entry.error_of("    brokers: b:1\n    exactly_once: true\n    transactional_id: 'a b'\n")
            .find("sinks[0].transactional_id: expected") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    exactly_once: true\n    progress_topic: 'a/b'\n")
            .find("sinks[0].progress_topic:") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    exactly_once: true\n    transaction_timeout: 1s\n")
            .find("sinks[0].transaction_timeout: expected delivery_timeout") == 0);
  CHECK(entry.error_of("    brokers: b:1\n    exactly_once: true\n    properties: {transaction.timeout.ms: 9000}\n")
            .find("sinks[0].properties.transaction.timeout.ms: not allowed with exactly_once") == 0);
}

TEST_CASE("kafka config: topic templates") {
  CHECK_FALSE(sinks::check_topic_template("{topic}"));
  CHECK_FALSE(sinks::check_topic_template("outbox.{topic}"));
  CHECK_FALSE(sinks::check_topic_template("all-events"));
  CHECK_FALSE(sinks::check_topic_template("{topic}.{topic}"));
  CHECK(sinks::check_topic_template("{topic"));
  CHECK(sinks::check_topic_template("a b"));
  CHECK(sinks::render_topic("outbox.{topic}", "order.paid") == "outbox.order.paid");
  CHECK(sinks::render_topic("{topic}-{topic}", "x") == "x-x");
  CHECK(sinks::render_topic("fixed", "x") == "fixed");
  CHECK(sinks::valid_kafka_topic_name("outbox.order_paid-1"));
  CHECK_FALSE(sinks::valid_kafka_topic_name("order/paid"));
  CHECK_FALSE(sinks::valid_kafka_topic_name(""));
  CHECK_FALSE(sinks::valid_kafka_topic_name("."));
  CHECK_FALSE(sinks::valid_kafka_topic_name(std::string(250, 'a')));
  CHECK(sinks::valid_kafka_topic_name(std::string(249, 'a')));
}

// In the librdkafka suite: it starts a real producer (librdkafka's threads), left out under TSan.
TEST_CASE("kafka config: the registry builds the sink; a producer librdkafka rejects is a ConfigError naming the key" *
          doctest::test_suite("librdkafka")) {
  log::set_level(log::Level::kError);  // the producer warns that nothing listens on port 1
  const auto good = entry.config("    brokers: '127.0.0.1:1'\n");
  auto sink = app::prepare_sinks(good).at(0).spec->make("k");
  CHECK(sink->name() == "k");
  CHECK_FALSE(sink->usable());  // nothing listens on port 1

  // acks=1 passes the property check alone, but the idempotent producer refuses it.
  const auto bad = entry.config("    brokers: '127.0.0.1:1'\n    properties: {acks: '1'}\n");
  try {
    app::prepare_sinks(bad).at(0).spec->make("k");
    FAIL("expected a ConfigError");
  } catch (const ConfigError& e) {
    CHECK(std::string(e.what()).find("sinks[0]: cannot create the Kafka producer:") == 0);
    CHECK(std::string(e.what()).find("acks") != std::string::npos);
  }
  log::set_level(log::Level::kInfo);
}
