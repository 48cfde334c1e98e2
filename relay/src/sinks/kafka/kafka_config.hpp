#pragma once
// type: kafka. The sink's typed settings and its strict YAML reader. No librdkafka types here.
#include <chrono>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "sinks/envelope.hpp"

namespace outbox::config {
class Section;
}

namespace outbox::sinks {

struct KafkaSinkConfig {
  // bootstrap.servers: "host:port[,host:port...]". Required.
  std::string brokers;
  // The Kafka topic for an event: literal topic characters plus the placeholder {topic}, the
  // row's topic. E.g. "outbox.{topic}". Checked at startup.
  std::string topic = "{topic}";
  // librdkafka properties, passed straight through (SASL, TLS, compression, linger.ms, ...).
  // The sink sets enable.idempotence=true and acks=all; see kafka_sink.hpp for the rest.
  std::map<std::string, std::string> properties;
  // How long one publish() waits for the delivery reports of its batch; events still without a
  // report then are retried (and the producer is replaced so nothing of that batch is sent late).
  // The default fits a batch and the final flush inside the relay's default 10 s shutdown bound.
  std::chrono::milliseconds delivery_timeout{5'000};
  // The config path of this sink (e.g. "sinks[1]"), for startup errors that name the key.
  std::string key_path;
  Envelope envelope;  // format: json (outbox-* headers) or cloudevents (ce_* headers)

  // exactly_once: a transactional producer; each batch and the sink's progress mark (the ids
  // committed to Kafka whose outcome Postgres may not have yet) go in one Kafka transaction, and
  // a relay taking over reads the mark back (docs/sinks.md, "Exactly once").
  bool exactly_once = false;
  // The transactional.id of the producer; "" = "outbox-relay.<sink name>". Needs exactly_once.
  std::string transactional_id;
  // The compacted topic the marks go to; "" = "<transactional_id>.progress". Needs exactly_once.
  std::string progress_topic;
  // transaction.timeout.ms; zero = max(10 s, 2 x delivery_timeout). Needs exactly_once.
  std::chrono::milliseconds transaction_timeout{0};

  // relay.batch_size when the config leaves it out: with exactly_once, 2,000. A transaction costs
  // the broker 4-10 ms of CPU and the sink four round trips whatever it holds, so a backlog drains
  // faster in fewer, larger ones (bench/RESULTS.md, "Kafka exactly once, the default batch size");
  // a steady stream's polls claim far fewer anyway.
  std::size_t preferred_batch_size() const { return exactly_once ? 2000 : 0; }
};

// The effective transactional.id, progress topic and transaction timeout of an exactly-once sink.
std::string effective_transactional_id(const KafkaSinkConfig& config, const std::string& sink_name);
std::string effective_progress_topic(const KafkaSinkConfig& config, const std::string& sink_name);
std::chrono::milliseconds effective_transaction_timeout(const KafkaSinkConfig& config);

// Reads brokers, topic, properties and delivery_timeout from a sink entry. Validates every
// property against librdkafka (unknown names, bad values) and registers secret values
// (sasl.password, ssl.key.password, ...) with the log redactor. Throws config::ConfigError.
KafkaSinkConfig parse_kafka_sink(config::Section& section);

// The row headers the sink never passes on (Sink::reserves_header): outbox-* (its own; a
// consumer's lastHeader("outbox-id") must read the relay's) and ce_* (CloudEvents' Kafka binding:
// a CloudEvents deserializer reads a record carrying ce_specversion as an event in binary mode,
// whatever the sink's format). Any case.
bool is_reserved_kafka_header(std::string_view name);

// Whether a librdkafka property holds a secret that must never be logged.
bool is_secret_kafka_property(const std::string& name);

// The effective settings for the startup log, secret property values as *****.
nlohmann::json describe_kafka_sink(const KafkaSinkConfig& config);

// The template check the parser applies: nullopt when valid, else what is wrong.
std::optional<std::string> check_topic_template(const std::string& topic_template);

// Renders the Kafka topic for an event topic: every {topic} replaced by event_topic.
std::string render_topic(const std::string& topic_template, const std::string& event_topic);

// Kafka's rule for topic names: 1 to 249 of [A-Za-z0-9._-], and not "." or "..".
bool valid_kafka_topic_name(const std::string& name);

}  // namespace outbox::sinks
