#include "sinks/rabbitmq/rabbitmq_config.hpp"

#include <amqp.h>

#include <nlohmann/json.hpp>
#include <vector>

#include "config/duration.hpp"
#include "config/section.hpp"
#include "core/sink.hpp"
#include "log/log.hpp"

namespace outbox::sinks {
namespace {

using config::ConfigError;

constexpr std::string_view kTopic = "{topic}";
constexpr std::string_view kKey = "{key}";

bool exchange_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '-' || c == '_' ||
         c == '.' || c == ':';
}

// The URL with the password of its user info replaced by *****. Works on the text as written
// (percent-encoded), so nothing of the password survives.
std::string mask_url_password(const std::string& url) {
  const std::size_t scheme_end = url.find("://");
  if (scheme_end == std::string::npos) return url;
  const std::size_t authority = scheme_end + 3;
  std::size_t authority_end = url.find_first_of("/?#", authority);
  if (authority_end == std::string::npos) authority_end = url.size();
  const std::size_t at = url.rfind('@', authority_end);
  if (at == std::string::npos || at < authority) return url;
  const std::size_t colon = url.find(':', authority);
  if (colon == std::string::npos || colon > at) return url;
  return url.substr(0, colon + 1) + "*****" + url.substr(at);
}

}  // namespace

std::optional<std::string> check_exchange_template(const std::string& t) {
  const std::string expected =
      "expected letters, digits, '-', '_', '.', ':' and the placeholder {topic}, e.g. \"outbox\" or "
      "\"events.{topic}\" (\"\" is the default exchange)";
  for (std::size_t i = 0; i < t.size();) {
    if (t.compare(i, kTopic.size(), kTopic) == 0) {
      i += kTopic.size();
    } else if (exchange_char(t[i])) {
      ++i;
    } else {
      return "unexpected '" + std::string(1, t[i]) + "' at position " + std::to_string(i) + " of '" + t + "'; " +
             expected;
    }
  }
  if (t.find(kTopic) == std::string::npos && t.size() > kMaxAmqpShortString) {
    return "longer than " + std::to_string(kMaxAmqpShortString) + " bytes";
  }
  return std::nullopt;
}

std::optional<std::string> check_routing_key_template(const std::string& t) {
  for (std::size_t i = 0; i < t.size();) {
    if (t.compare(i, kTopic.size(), kTopic) == 0) {
      i += kTopic.size();
    } else if (t.compare(i, kKey.size(), kKey) == 0) {
      i += kKey.size();
    } else if (t[i] == '{' || t[i] == '}') {
      return "unexpected '" + std::string(1, t[i]) + "' at position " + std::to_string(i) + " of '" + t +
             "'; the placeholders are {topic} and {key}";
    } else {
      ++i;
    }
  }
  if (t.find('{') == std::string::npos && t.size() > kMaxAmqpShortString) {
    return "longer than " + std::to_string(kMaxAmqpShortString) + " bytes";
  }
  return std::nullopt;
}

std::string render_rabbitmq_template(const std::string& text, const std::string& topic, const std::string& key) {
  std::string out;
  out.reserve(text.size() + topic.size());
  for (std::size_t i = 0; i < text.size();) {
    if (text.compare(i, kTopic.size(), kTopic) == 0) {
      out += topic;
      i += kTopic.size();
    } else if (text.compare(i, kKey.size(), kKey) == 0) {
      out += key;
      i += kKey.size();
    } else {
      out += text[i++];
    }
  }
  return out;
}

bool is_reserved_rabbitmq_header(std::string_view name) {
  const auto is = [&](std::string_view exact) { return name.size() == exact.size() && header_has_prefix(name, exact); };
  return is_outbox_header(name) || is("cc") || is("bcc") || header_has_prefix(name, "x-") ||
         header_has_prefix(name, "cloudevents");
}

RabbitmqSinkConfig parse_rabbitmq_sink(config::Section& s) {
  RabbitmqSinkConfig c;
  c.key_path = s.path();

  c.url = s.required_string("url");
  // amqp_parse_url() decodes in place and points into the buffer: keep it until copied.
  std::vector<char> buffer(c.url.begin(), c.url.end());
  buffer.push_back('\0');
  amqp_connection_info info{};
  const int rc = amqp_parse_url(buffer.data(), &info);
  if (rc == AMQP_STATUS_OK && info.password && *info.password) log::add_secret(info.password);
  c.url_for_logs = mask_url_password(c.url);
  // Never echo the URL in an error: it may carry a password.
  if (rc != AMQP_STATUS_OK) {
    throw ConfigError(s.key_path("url") + ": expected amqp://user:password@host:port/vhost or amqps://... for TLS (" +
                      amqp_error_string2(rc) + ")");
  }
  c.tls = info.ssl != 0;
  if (!info.host || !*info.host) throw ConfigError(s.key_path("url") + ": the URL has no host");
  c.host = info.host;
  c.port = info.port;
  c.vhost = info.vhost ? info.vhost : "/";
  c.user = info.user ? info.user : "guest";
  c.password = info.password ? info.password : "guest";
  if (c.vhost.empty()) c.vhost = "/";

  if (!s.has("exchange")) {
    throw ConfigError(s.key_path("exchange") +
                      ": required, but missing (a template with {topic}; \"\" publishes to the default exchange)");
  }
  c.exchange = s.string_or("exchange", "");
  if (auto error = check_exchange_template(c.exchange)) {
    throw ConfigError(s.key_path("exchange") + ": " + *error);
  }
  c.routing_key = s.string_or("routing_key", c.routing_key);
  if (auto error = check_routing_key_template(c.routing_key)) {
    throw ConfigError(s.key_path("routing_key") + ": " + *error);
  }

  c.timeout = s.duration_or("timeout", c.timeout);
  if (c.timeout < std::chrono::milliseconds{100} || c.timeout > std::chrono::minutes{10}) {
    throw ConfigError(s.key_path("timeout") + ": expected 100ms to 10m, got " + config::format_duration(c.timeout));
  }
  c.max_in_flight = static_cast<int>(s.integer_or("max_in_flight", c.max_in_flight, 1, kMaxRabbitmqInFlight));
  c.recovery_grace = s.duration_or("recovery_grace", c.recovery_grace);
  if (c.recovery_grace > std::chrono::hours{1}) {
    throw ConfigError(s.key_path("recovery_grace") + ": expected 0s to 1h, got " +
                      config::format_duration(c.recovery_grace));
  }
  const std::string key_order = s.choice_or("key_order", "confirm", {"confirm", "channel"});
  c.key_order = key_order == "channel" ? RabbitmqKeyOrder::kChannel : RabbitmqKeyOrder::kConfirm;
  c.tls_files = parse_tls_files(s, c.tls, "amqps://");
  return c;
}

nlohmann::json describe_rabbitmq_sink(const RabbitmqSinkConfig& c) {
  nlohmann::json j{{"url", c.url_for_logs},
                   {"exchange", c.exchange},
                   {"routing_key", c.routing_key},
                   {"timeout", config::format_duration(c.timeout)},
                   {"max_in_flight", c.max_in_flight},
                   {"recovery_grace", config::format_duration(c.recovery_grace)},
                   {"key_order", c.key_order == RabbitmqKeyOrder::kChannel ? "channel" : "confirm"}};
  if (c.tls) j["tls"] = describe_tls_files(c.tls_files);
  return j;
}

}  // namespace outbox::sinks
