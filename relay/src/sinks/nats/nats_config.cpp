#include "sinks/nats/nats_config.hpp"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <regex>

#include "config/duration.hpp"
#include "config/section.hpp"
#include "core/sink.hpp"
#include "log/log.hpp"
#include "sinks/common/topic_template.hpp"

namespace outbox::sinks {
namespace {

using config::ConfigError;

constexpr const char* kPlaceholder = "{topic}";
constexpr std::size_t kPlaceholderSize = 7;

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t");
  if (first == std::string::npos) return {};
  return text.substr(first, text.find_last_not_of(" \t") - first + 1);
}

std::vector<std::string> split_urls(const std::string& url) {
  std::vector<std::string> parts;
  std::size_t start = 0;
  for (;;) {
    const std::size_t comma = url.find(',', start);
    parts.push_back(trim(url.substr(start, comma == std::string::npos ? std::string::npos : comma - start)));
    if (comma == std::string::npos) return parts;
    start = comma + 1;
  }
}

// Subject characters: printable ASCII except whitespace; '.', '*' and '>' have meanings checked
// per token.
bool subject_char(char c) { return c > 0x20 && c < 0x7f; }

}  // namespace

std::optional<std::string> check_nats_url(const std::string& url, std::string* url_for_logs,
                                          std::vector<std::string>* secrets) {
  const std::string expected = "expected nats://[user:password@]host:port (or tls://), several separated by commas";
  // Credentials first, before anything can fail: the caller masks them before it reports.
  std::string masked;
  std::vector<std::string> found;
  for (const auto& part : split_urls(url)) {
    std::string shown = part;
    const auto scheme_end = part.find("://");
    const auto at = part.rfind('@');
    if (scheme_end != std::string::npos && at != std::string::npos && at > scheme_end) {
      const std::string userinfo = part.substr(scheme_end + 3, at - scheme_end - 3);
      const auto colon = userinfo.find(':');
      const std::string secret = colon == std::string::npos ? userinfo : userinfo.substr(colon + 1);
      if (!secret.empty()) found.push_back(secret);
      const std::string user_shown = colon == std::string::npos ? "*****" : userinfo.substr(0, colon) + ":*****";
      shown = part.substr(0, scheme_end + 3) + user_shown + part.substr(at);
    }
    masked += (masked.empty() ? "" : ",") + shown;
  }
  if (url_for_logs) *url_for_logs = masked;
  if (secrets) *secrets = found;

  static const std::regex kOne(R"((nats|tls)://([^@/]*@)?(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9._-]+)(:([0-9]{1,5}))?/?)",
                               std::regex::icase);
  for (const auto& part : split_urls(url)) {
    std::smatch m;
    if (part.empty()) return "empty URL in the list; " + expected;
    if (!std::regex_match(part, m, kOne)) {
      const auto scheme_end = part.find("://");
      if (scheme_end != std::string::npos) {
        std::string scheme = part.substr(0, scheme_end);
        std::transform(scheme.begin(), scheme.end(), scheme.begin(),
                       [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
        if (scheme != "nats" && scheme != "tls") {
          return "unsupported scheme '" + log::redact(scheme) + "', expected one of: nats, tls";
        }
      }
      return expected;
    }
    if (m[5].matched) {
      const long port = std::stol(m[5].str());
      if (port < 1 || port > 65'535) return "port " + m[5].str() + " out of range 1..65535";
    }
  }
  return std::nullopt;
}

std::optional<std::string> check_subject_template(const std::string& t) {
  const std::string expected =
      "expected tokens of letters, digits and '-', '_' separated by '.', with the placeholder {topic}, e.g. "
      "\"outbox.{topic}\" (no spaces, no wildcards '*' or '>')";
  if (t.empty()) return "must not be empty; " + expected;
  std::string probe;  // the template with {topic} as one token character, checked as a subject
  for (std::size_t i = 0; i < t.size();) {
    if (t.compare(i, kPlaceholderSize, kPlaceholder) == 0) {
      probe += 'x';
      i += kPlaceholderSize;
    } else if (t[i] == '{' || t[i] == '}' || !subject_char(t[i])) {
      return "unexpected '" + std::string(1, t[i]) + "' at position " + std::to_string(i) + " of '" + t + "'; " +
             expected;
    } else {
      probe += t[i++];
    }
  }
  if (!valid_nats_subject(probe)) return "'" + t + "' does not make a valid subject; " + expected;
  return std::nullopt;
}

std::string render_subject(const std::string& subject_template, const std::string& event_topic) {
  return render_topic_template(subject_template, event_topic);
}

bool valid_nats_subject(const std::string& subject) {
  if (subject.empty()) return false;
  std::size_t start = 0;
  for (;;) {
    const std::size_t dot = subject.find('.', start);
    const std::string token = subject.substr(start, dot == std::string::npos ? std::string::npos : dot - start);
    if (token.empty() || token == "*" || token == ">") return false;
    if (!std::all_of(token.begin(), token.end(), subject_char)) return false;
    if (dot == std::string::npos) return true;
    start = dot + 1;
  }
}

bool valid_nats_header_name(const std::string& name) {
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(), [](char c) { return subject_char(c) && c != ':'; });
}

bool valid_nats_header_value(const std::string& value) {
  return value.find_first_of(std::string("\r\n\0", 3)) == std::string::npos;
}

bool is_reserved_nats_header(std::string_view name) {
  return is_outbox_header(name) || header_has_prefix(name, "nats-") || header_has_prefix(name, "ce-");
}

NatsSinkConfig parse_nats_sink(config::Section& s) {
  NatsSinkConfig c;
  c.key_path = s.path();

  c.url = s.required_string("url");
  std::vector<std::string> secrets;
  const auto url_error = check_nats_url(c.url, &c.url_for_logs, &secrets);
  for (const auto& secret : secrets) log::add_secret(secret);  // before any error can print it
  if (url_error) throw ConfigError(s.key_path("url") + ": " + *url_error);

  c.subject = s.string_or("subject", c.subject);
  if (auto error = check_subject_template(c.subject)) throw ConfigError(s.key_path("subject") + ": " + *error);

  c.timeout = s.duration_or("timeout", c.timeout, std::chrono::milliseconds{100}, std::chrono::minutes{10});
  c.max_in_flight = static_cast<int>(s.integer_or("max_in_flight", c.max_in_flight, 1, kMaxNatsInFlight));
  const std::string no_stream = s.choice_or("no_stream", "retry", {"retry", "permanent"});
  c.no_stream = no_stream == "permanent" ? NatsNoStream::kPermanent : NatsNoStream::kRetry;
  return c;
}

nlohmann::json describe_nats_sink(const NatsSinkConfig& c) {
  return {{"url", c.url_for_logs},
          {"subject", c.subject},
          {"timeout", config::format_duration(c.timeout)},
          {"max_in_flight", c.max_in_flight},
          {"no_stream", c.no_stream == NatsNoStream::kPermanent ? "permanent" : "retry"}};
}

}  // namespace outbox::sinks
