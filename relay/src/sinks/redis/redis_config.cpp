#include "sinks/redis/redis_config.hpp"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>

#include "config/duration.hpp"
#include "config/section.hpp"
#include "log/log.hpp"
#include "sinks/common/topic_template.hpp"

namespace outbox::sinks {
namespace {

using config::ConfigError;

constexpr const char* kPlaceholder = "{topic}";
constexpr const char* kUrlExpected = "expected redis://[user[:password]@]host[:port][/db] or rediss://... for TLS";

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// %XX-decodes a URL part. nullopt for a malformed escape.
std::optional<std::string> percent_decode(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] != '%') {
      out += text[i];
      continue;
    }
    const int hi = i + 1 < text.size() ? hex_value(text[i + 1]) : -1;
    const int lo = i + 2 < text.size() ? hex_value(text[i + 2]) : -1;
    if (hi < 0 || lo < 0) return std::nullopt;
    out += static_cast<char>(hi * 16 + lo);
    i += 2;
  }
  return out;
}

bool all_digits(const std::string& text) {
  return !text.empty() && text.size() <= 9 &&
         std::all_of(text.begin(), text.end(), [](unsigned char c) { return std::isdigit(c) != 0; });
}

void parse_url(config::Section& s, RedisSinkConfig& c) {
  c.url = s.required_string("url");
  const std::string key = s.key_path("url");
  // Never echo the URL in an error: it may carry a password.
  std::string rest;
  if (c.url.rfind("redis://", 0) == 0) {
    rest = c.url.substr(8);
  } else if (c.url.rfind("rediss://", 0) == 0) {
    rest = c.url.substr(9);
    c.tls = true;
  } else {
    throw ConfigError(key + ": unsupported scheme, " + kUrlExpected);
  }
  if (rest.find_first_of("?#") != std::string::npos) {
    throw ConfigError(key + ": query strings and fragments are not supported; " + kUrlExpected +
                      " (TLS files go under the sink's tls key)");
  }
  const std::size_t slash = rest.find('/');
  std::string authority = rest.substr(0, slash);
  const std::string path = slash == std::string::npos ? "" : rest.substr(slash + 1);

  // userinfo: the last '@' ends it (a password may contain '@' only percent-encoded, but be lenient).
  const std::size_t at = authority.rfind('@');
  if (at != std::string::npos) {
    const std::string userinfo = authority.substr(0, at);
    authority = authority.substr(at + 1);
    const std::size_t colon = userinfo.find(':');
    // The password as written (maybe %-encoded in another way than the redactor encodes it).
    log::add_secret(colon == std::string::npos ? userinfo : userinfo.substr(colon + 1));
    auto user = percent_decode(userinfo.substr(0, colon));
    auto password =
        colon == std::string::npos ? std::optional<std::string>("") : percent_decode(userinfo.substr(colon + 1));
    if (password && !password->empty()) log::add_secret(*password);
    if (!user || !password) throw ConfigError(key + ": malformed %-escape in the user or password");
    if (colon == std::string::npos) {
      // redis://secret@host: a lone userinfo is the password (as redis-cli and redis-py read it).
      c.password = *user;
      if (!c.password.empty()) log::add_secret(c.password);
    } else {
      c.username = *user;
      c.password = *password;
    }
  }

  std::string port_text;
  if (!authority.empty() && authority[0] == '[') {
    const std::size_t close = authority.find(']');
    if (close == std::string::npos) throw ConfigError(key + ": unterminated [IPv6] host; " + kUrlExpected);
    c.host = authority.substr(1, close - 1);
    const std::string after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after[0] != ':') throw ConfigError(key + ": unexpected text after the [IPv6] host; " + kUrlExpected);
      port_text = after.substr(1);
    }
  } else {
    const std::size_t colon = authority.find(':');
    c.host = authority.substr(0, colon);
    if (colon != std::string::npos) port_text = authority.substr(colon + 1);
  }
  if (c.host.empty()) throw ConfigError(key + ": the URL has no host; " + kUrlExpected);
  if (!port_text.empty() || authority.find(':') != std::string::npos) {
    if (!all_digits(port_text) || std::stoi(port_text) < 1 || std::stoi(port_text) > 65535) {
      throw ConfigError(key + ": the port must be a number from 1 to 65535");
    }
    c.port = std::stoi(port_text);
  }
  if (!path.empty()) {
    if (!all_digits(path)) throw ConfigError(key + ": the path must be a database number (/0, /1, ...)");
    c.db = std::stoi(path);
  }

  c.url_for_logs = c.tls ? "rediss://" : "redis://";
  if (!c.username.empty() || !c.password.empty()) {
    c.url_for_logs += c.username + (c.password.empty() ? "" : ":*****") + "@";
  }
  c.url_for_logs += (c.host.find(':') != std::string::npos ? "[" + c.host + "]" : c.host) + ":" +
                    std::to_string(c.port) + "/" + std::to_string(c.db);
}

}  // namespace

std::optional<std::string> check_stream_template(const std::string& t) {
  const std::string expected = "expected text and the placeholder {topic}, e.g. \"outbox.{topic}\"";
  if (t.empty()) return "must not be empty; " + expected;
  const std::size_t n = std::char_traits<char>::length(kPlaceholder);
  for (std::size_t i = 0; i < t.size();) {
    if (t.compare(i, n, kPlaceholder) == 0) {
      i += n;
    } else if (t[i] == '{' || t[i] == '}') {
      return "unexpected '" + std::string(1, t[i]) + "' at position " + std::to_string(i) + " of '" + t +
             "' (the only placeholder is {topic}); " + expected;
    } else {
      ++i;
    }
  }
  return std::nullopt;
}

std::string render_stream(const std::string& stream_template, const std::string& event_topic) {
  return render_topic_template(stream_template, event_topic);
}

RedisSinkConfig parse_redis_sink(config::Section& s) {
  RedisSinkConfig c;
  c.key_path = s.path();
  parse_url(s, c);  // first: registers the password before any other error can be printed

  c.stream = s.string_or("stream", c.stream);
  if (auto error = check_stream_template(c.stream)) throw ConfigError(s.key_path("stream") + ": " + *error);

  if (s.has("maxlen")) c.maxlen = s.integer_or("maxlen", 0, 1, std::int64_t{1} << 53);

  c.timeout = s.duration_or("timeout", c.timeout, std::chrono::milliseconds{100}, std::chrono::minutes{10});
  c.tls_files = parse_tls_files(s, c.tls, "rediss://");
  return c;
}

nlohmann::json describe_redis_sink(const RedisSinkConfig& c) {
  nlohmann::json j{{"url", c.url_for_logs},
                   {"stream", c.stream},
                   {"maxlen", c.maxlen ? nlohmann::json(*c.maxlen) : nlohmann::json(nullptr)},
                   {"timeout", config::format_duration(c.timeout)}};
  if (c.tls) {
    j["tls"] = describe_tls_files(c.tls_files);
  }
  return j;
}

}  // namespace outbox::sinks
