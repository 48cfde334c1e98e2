#pragma once
// type: rabbitmq. The sink's typed settings and its strict YAML reader. No rabbitmq-c types here.
//   url: amqp://user:pass@host:5672/vhost   required (amqps://, port 5671 by default, for TLS; the
//                                            password is masked in logs)
//   exchange: "outbox"                       required, template: {topic}; "" is the default exchange
//   routing_key: "{topic}"                   template: {topic} and {key} (the aggregate_id)
//   timeout: 5s                              connect/login, and the wait for a batch's confirms
//   max_in_flight: 1000                      published events without a confirm yet, of every
//                                            batch in the sink (1..65535); one per key
//   recovery_grace: 30s                      NO_ROUTE / NOT_FOUND retry until the broker has been
//                                            reachable this long, then dead-letter (0s..1h)
//   key_order: confirm                       confirm: a key's next event is published once the one
//                                            before is confirmed; channel: back to back (faster for
//                                            many events of one key; a basic.nack may reorder)
//   tls: {ca_file, cert_file, key_file, insecure_skip_verify}   only with amqps:// (sinks/tls_client.hpp)
#include <chrono>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>
#include <string_view>

#include "sinks/tls_client.hpp"

namespace outbox::config {
class Section;
}

namespace outbox::sinks {

// How the events of one key in a batch are published.
enum class RabbitmqKeyOrder {
  // Default: the next only once the broker confirmed the one before (or returned it: dead-lettered).
  // A key's messages reach a queue in id order whatever the broker answers: a basic.nack of one
  // (x-overflow reject-publish, a crashed queue process) holds back the rest.
  kConfirm,
  // Back to back on the channel, whose order RabbitMQ keeps in each queue: one round trip for a
  // batch however many events of a key it has. A basic.nack of one while the broker takes a later
  // one of its key puts the later one in the queue first (it is retried and arrives again after).
  kChannel,
};

struct RabbitmqSinkConfig {
  std::string url;           // as configured: may carry a password, never log it
  std::string url_for_logs;  // the same URL with the password replaced by *****
  // The parts of url, as amqp_parse_url() decodes them.
  bool tls = false;  // amqps://
  std::string host;
  int port = 5672;
  std::string vhost = "/";
  std::string user = "guest";
  std::string password = "guest";
  // Templates: every {topic} is replaced by the row's topic, in routing_key also every {key} by
  // the row's aggregate_id.
  std::string exchange;
  std::string routing_key = "{topic}";
  // Bounds connecting and logging in, and how long the sink waits for the publisher confirms of
  // a batch from its submit() (events without a confirm then retry and the connection is replaced).
  std::chrono::milliseconds timeout{5'000};
  int max_in_flight = 1000;
  TlsFiles tls_files;  // with amqps://: verification on unless insecure_skip_verify
  // NO_ROUTE and NOT_FOUND dead-letter an event only once the broker has been reachable, without
  // a lost connection, for this long; before that they retry (classify_amqp_reply).
  std::chrono::milliseconds recovery_grace{30'000};
  RabbitmqKeyOrder key_order = RabbitmqKeyOrder::kConfirm;
  // The config path of this sink (e.g. "sinks[1]"), for errors that name the key.
  std::string key_path;
};

inline constexpr int kMaxRabbitmqInFlight = 65535;
// AMQP 0-9-1 short strings: exchange names and routing keys are at most 255 bytes.
inline constexpr std::size_t kMaxAmqpShortString = 255;

// Reads url, exchange, routing_key, timeout, max_in_flight, recovery_grace, key_order and tls from
// a sink entry and registers the URL's password with the log redactor before anything can print
// it. Throws config::ConfigError naming the key.
RabbitmqSinkConfig parse_rabbitmq_sink(config::Section& section);

// The row headers the sink never passes on (Sink::reserves_header): outbox-* (its own), CC and
// BCC (RabbitMQ routes a message to their routing keys too: sender-selected distribution), x-*
// (what RabbitMQ and its plugins act on: x-delay, x-deduplication-header, ...) and cloudEvents*
// (CloudEvents' AMQP binding). Any case.
bool is_reserved_rabbitmq_header(std::string_view name);

// The effective settings for the startup log, the password as *****.
nlohmann::json describe_rabbitmq_sink(const RabbitmqSinkConfig& config);

// The template checks the parser applies: nullopt when valid, else what is wrong. An exchange
// template may hold {topic} and the characters RabbitMQ allows in exchange names (letters,
// digits, '-', '_', '.', ':'); a routing key template any text, with {topic} and {key} as the
// only placeholders.
std::optional<std::string> check_exchange_template(const std::string& t);
std::optional<std::string> check_routing_key_template(const std::string& t);

// Renders a template for one event: {topic} -> topic, {key} -> key.
std::string render_rabbitmq_template(const std::string& text, const std::string& topic, const std::string& key);

}  // namespace outbox::sinks
