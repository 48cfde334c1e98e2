#include "sinks/kafka/kafka_config.hpp"

#include <memory>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "config/duration.hpp"
#include "config/section.hpp"
#include "core/sink.hpp"
#include "log/log.hpp"
#include "sinks/common/topic_template.hpp"
#include "sinks/kafka/rdkafka.hpp"

namespace outbox::sinks {
namespace {

constexpr const char* kPlaceholder = "{topic}";

struct ConfDeleter {
  void operator()(rd_kafka_conf_t* conf) const { rd_kafka_conf_destroy(conf); }
};

bool topic_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' || c == '_' || c == '-';
}

// Properties the sink owns. The value is why, for the error message.
const std::map<std::string, std::string>& reserved_properties() {
  static const std::map<std::string, std::string> kReserved{
      {"bootstrap.servers", "set it with the sink's brokers key"},
      {"metadata.broker.list", "set it with the sink's brokers key"},
      {"message.timeout.ms",
       "the sink keeps librdkafka's message timeout infinite (a timed-out message leaves a gap in a "
       "partition's sequence) and bounds each batch with delivery_timeout instead"},
      {"delivery.timeout.ms",
       "the sink keeps librdkafka's message timeout infinite (a timed-out message leaves a gap in a "
       "partition's sequence) and bounds each batch with delivery_timeout instead"},
      {"transactional.id",
       "the sink sets it: with exactly_once: true from the sink's transactional_id key, else it uses the "
       "idempotent producer, not transactions"},
      {"delivery.report.only.error", "the sink needs every delivery report to mark events delivered"},
      {"dr_msg_cb", "the sink installs its own callbacks"},
      {"dr_cb", "the sink installs its own callbacks"},
      {"error_cb", "the sink installs its own callbacks"},
      {"log_cb", "the sink installs its own callbacks"},
      {"stats_cb", "the sink installs its own callbacks"},
      {"opaque", "the sink installs its own callbacks"},
  };
  return kReserved;
}

}  // namespace

bool is_secret_kafka_property(const std::string& name) {
  return name.find("password") != std::string::npos || name.find("secret") != std::string::npos ||
         name == "ssl.key.pem" || name == "sasl.oauthbearer.config";
}

std::optional<std::string> check_topic_template(const std::string& t) {
  const std::string expected =
      "expected letters, digits, '.', '_', '-' and the placeholder {topic}, e.g. \"outbox.{topic}\"";
  if (t.empty()) return "must not be empty; " + expected;
  for (std::size_t i = 0; i < t.size();) {
    if (t.compare(i, std::char_traits<char>::length(kPlaceholder), kPlaceholder) == 0) {
      i += std::char_traits<char>::length(kPlaceholder);
    } else if (topic_char(t[i])) {
      ++i;
    } else {
      return "unexpected '" + std::string(1, t[i]) + "' at position " + std::to_string(i) + " of '" + t + "'; " +
             expected;
    }
  }
  if (t.find(kPlaceholder) == std::string::npos && !valid_kafka_topic_name(t)) {
    return "'" + t + "' is not a valid Kafka topic name (1 to 249 characters, not '.' or '..')";
  }
  return std::nullopt;
}

std::string render_topic(const std::string& topic_template, const std::string& event_topic) {
  return render_topic_template(topic_template, event_topic);
}

bool valid_kafka_topic_name(const std::string& name) {
  if (name.empty() || name.size() > 249 || name == "." || name == "..") return false;
  for (char c : name) {
    if (!topic_char(c)) return false;
  }
  return true;
}

bool is_reserved_kafka_header(std::string_view name) {
  return is_outbox_header(name) || header_has_prefix(name, "ce_");
}

KafkaSinkConfig parse_kafka_sink(config::Section& s) {
  KafkaSinkConfig c;
  c.key_path = s.path();

  c.brokers = s.required_string("brokers");
  static const std::regex kBroker(R"(([A-Za-z]+://)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:[0-9]{1,5})?)");
  std::size_t start = 0;
  while (start <= c.brokers.size()) {
    std::size_t comma = c.brokers.find(',', start);
    if (comma == std::string::npos) comma = c.brokers.size();
    std::string one = c.brokers.substr(start, comma - start);
    one.erase(0, one.find_first_not_of(" \t"));
    one.erase(one.find_last_not_of(" \t") + 1);
    if (!std::regex_match(one, kBroker)) {
      throw config::ConfigError(s.key_path("brokers") + ": expected host:port[,host:port...], got '" + c.brokers + "'");
    }
    start = comma + 1;
  }

  c.topic = s.string_or("topic", c.topic);
  if (auto error = check_topic_template(c.topic)) throw config::ConfigError(s.key_path("topic") + ": " + *error);

  c.delivery_timeout = s.duration_or("delivery_timeout", c.delivery_timeout);
  if (c.delivery_timeout < std::chrono::milliseconds{100} || c.delivery_timeout > std::chrono::hours{1}) {
    throw config::ConfigError(s.key_path("delivery_timeout") + ": expected 100ms to 1h, got " +
                              config::format_duration(c.delivery_timeout));
  }

  c.exactly_once = s.boolean_or("exactly_once", false);
  for (const char* key : {"transactional_id", "progress_topic", "transaction_timeout"}) {
    if (!c.exactly_once && s.has(key)) {
      throw config::ConfigError(s.key_path(key) + ": only with exactly_once: true");
    }
  }
  c.transactional_id = s.string_or("transactional_id", "");
  if (!c.transactional_id.empty() && !valid_kafka_topic_name(c.transactional_id)) {
    throw config::ConfigError(s.key_path("transactional_id") +
                              ": expected 1 to 249 of letters, digits, '.', '_', '-', got '" + c.transactional_id +
                              "'");
  }
  c.progress_topic = s.string_or("progress_topic", "");
  if (!c.progress_topic.empty() && !valid_kafka_topic_name(c.progress_topic)) {
    throw config::ConfigError(s.key_path("progress_topic") + ": '" + c.progress_topic +
                              "' is not a valid Kafka topic name (1 to 249 of letters, digits, '.', '_', '-')");
  }
  c.transaction_timeout = s.duration_or("transaction_timeout", c.transaction_timeout);
  if (c.exactly_once && s.has("transaction_timeout") &&
      (c.transaction_timeout < c.delivery_timeout || c.transaction_timeout > std::chrono::minutes{15})) {
    throw config::ConfigError(s.key_path("transaction_timeout") + ": expected delivery_timeout (" +
                              config::format_duration(c.delivery_timeout) + ") to 15m, got " +
                              config::format_duration(c.transaction_timeout));
  }

  c.properties = s.string_map("properties");
  // Mask secrets before anything below can echo a value in an error.
  for (const auto& [name, value] : c.properties) {
    if (is_secret_kafka_property(name)) log::add_secret(value);
  }
  // Check every property against librdkafka now, so a typo fails at startup (exit 2) and names
  // the key, instead of when the producer is created.
  std::unique_ptr<rd_kafka_conf_t, ConfDeleter> scratch(rd_kafka_conf_new());
  for (const auto& [name, value] : c.properties) {
    const std::string key = s.key_path("properties") + "." + name;
    if (auto it = reserved_properties().find(name); it != reserved_properties().end()) {
      throw config::ConfigError(key + ": not allowed here: " + it->second);
    }
    if (c.exactly_once && name == "transaction.timeout.ms") {
      throw config::ConfigError(key + ": not allowed with exactly_once: true: set the sink's transaction_timeout key");
    }
    if (name == "enable.idempotence" && value != "true") {
      throw config::ConfigError(key + ": must be true: per-key order across retries needs the idempotent producer");
    }
    char error[512] = {};
    if (rd_kafka_conf_set(scratch.get(), name.c_str(), value.c_str(), error, sizeof error) != RD_KAFKA_CONF_OK) {
      throw config::ConfigError(key + ": " + error);
    }
  }
  return c;
}

nlohmann::json describe_kafka_sink(const KafkaSinkConfig& c) {
  nlohmann::json properties = nlohmann::json::object();
  for (const auto& [name, value] : c.properties) properties[name] = is_secret_kafka_property(name) ? "*****" : value;
  nlohmann::json d = {{"brokers", c.brokers},
                      {"topic", c.topic},
                      {"delivery_timeout", config::format_duration(c.delivery_timeout)},
                      {"properties", properties}};
  if (c.exactly_once) {
    d["exactly_once"] = true;
    d["transaction_timeout"] = config::format_duration(effective_transaction_timeout(c));
    if (!c.transactional_id.empty()) d["transactional_id"] = c.transactional_id;
    if (!c.progress_topic.empty()) d["progress_topic"] = c.progress_topic;
  }
  return d;
}

std::string effective_transactional_id(const KafkaSinkConfig& c, const std::string& sink_name) {
  return c.transactional_id.empty() ? "outbox-relay." + sink_name : c.transactional_id;
}

std::string effective_progress_topic(const KafkaSinkConfig& c, const std::string& sink_name) {
  return c.progress_topic.empty() ? effective_transactional_id(c, sink_name) + ".progress" : c.progress_topic;
}

std::chrono::milliseconds effective_transaction_timeout(const KafkaSinkConfig& c) {
  if (c.transaction_timeout > std::chrono::milliseconds::zero()) return c.transaction_timeout;
  return std::max<std::chrono::milliseconds>(std::chrono::seconds{10}, 2 * c.delivery_timeout);
}

}  // namespace outbox::sinks
