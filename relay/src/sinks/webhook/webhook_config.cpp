#include "sinks/webhook/webhook_config.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>

#include "config/duration.hpp"
#include "config/section.hpp"
#include "log/log.hpp"
#include "sinks/common/c_handle.hpp"
#include "sinks/webhook/signature.hpp"

namespace outbox::sinks {
namespace {

using config::ConfigError;

using CurlUrlPtr = CHandle<CURLU, &curl_url_cleanup>;

// A string curl allocated.
std::string take_curl_string(char* text) {
  if (!text) return {};
  std::string out(text);
  curl_free(text);
  return out;
}

std::string url_part(CURLU* url, CURLUPart part) {
  char* text = nullptr;
  if (curl_url_get(url, part, &text, 0) != CURLUE_OK) return {};
  return take_curl_string(text);
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

// Header values that look like credentials are masked in every log line, not only in describe().
bool looks_like_credential(const std::string& name) {
  const std::string n = lower(name);
  for (const char* word : {"auth", "token", "secret", "key", "password", "cookie", "signature", "session"}) {
    if (n.find(word) != std::string::npos) return true;
  }
  return false;
}

void parse_url(config::Section& s, WebhookSinkConfig& c) {
  c.url = s.required_string("url");
  CurlUrlPtr url(curl_url());
  if (!url) throw std::bad_alloc();
  // Never echo the URL in an error: it may carry a password or a token.
  if (const CURLUcode rc = curl_url_set(url.get(), CURLUPART_URL, c.url.c_str(), 0); rc != CURLUE_OK) {
    throw ConfigError(s.key_path("url") + ": expected an absolute http:// or https:// URL (" + curl_url_strerror(rc) +
                      ")");
  }
  const std::string scheme = lower(url_part(url.get(), CURLUPART_SCHEME));
  if (scheme != "http" && scheme != "https") {
    throw ConfigError(s.key_path("url") + ": unsupported scheme '" + scheme + "', expected one of: http, https");
  }
  if (url_part(url.get(), CURLUPART_HOST).empty()) throw ConfigError(s.key_path("url") + ": the URL has no host");
  const std::string password = url_part(url.get(), CURLUPART_PASSWORD);
  if (!password.empty()) {
    log::add_secret(password);
    curl_url_set(url.get(), CURLUPART_PASSWORD, "*****", 0);
  }
  // A query often carries the endpoint's token (?token=..., ?sig=...): its values are masked too,
  // its names kept.
  if (const std::string query = url_part(url.get(), CURLUPART_QUERY); !query.empty()) {
    std::string masked;
    std::size_t pos = 0;
    while (pos <= query.size()) {
      const std::size_t end = std::min(query.find('&', pos), query.size());
      const std::string pair = query.substr(pos, end - pos);
      const std::size_t eq = pair.find('=');
      masked += (masked.empty() ? "" : "&") +
                (eq == std::string::npos ? std::string("*****") : pair.substr(0, eq + 1) + "*****");
      pos = end + 1;
    }
    curl_url_set(url.get(), CURLUPART_QUERY, masked.c_str(), 0);
  }
  c.url_for_logs = url_part(url.get(), CURLUPART_URL);
  if (c.url_for_logs.empty()) c.url_for_logs = "*****";
}

void parse_headers(config::Section& s, WebhookSinkConfig& c) {
  std::set<std::string> seen;
  for (auto& [name, value] : s.string_map("headers")) {
    const std::string key = s.key_path("headers") + "." + name;
    if (looks_like_credential(name)) log::add_secret(value);
    if (!is_valid_header_name(name)) {
      throw ConfigError(key + ": not a valid HTTP header name (letters, digits and !#$%&'*+-.^_`|~ only)");
    }
    if (!is_valid_header_value(value)) throw ConfigError(key + ": header values must not contain CR, LF or NUL");
    if (is_reserved_webhook_header(name)) {
      throw ConfigError(key +
                        ": the webhook sink sets this header itself (content-type, webhook-id, "
                        "webhook-timestamp, webhook-signature and the framing headers are reserved)");
    }
    if (!seen.insert(lower(name)).second) {
      throw ConfigError(key + ": duplicate header (header names are case-insensitive)");
    }
    c.headers.emplace_back(name, value);
  }
}

void parse_secrets(config::Section& s, WebhookSinkConfig& c) {
  c.secrets = s.string_list("secrets");
  for (const auto& secret : c.secrets) {
    if (secret != "whsec_") log::add_secret(secret);  // before any check can print it
  }
  for (std::size_t i = 0; i < c.secrets.size(); ++i) {
    const std::string key = s.key_path("secrets") + "[" + std::to_string(i) + "]";
    const std::string& secret = c.secrets[i];
    if (secret.rfind("whsec_", 0) != 0) {
      throw ConfigError(key +
                        ": expected a Standard Webhooks secret, whsec_ followed by the base64 key; "
                        "the value does not start with whsec_");
    }
    auto decoded = webhook::decode_whsec_secret(secret);
    if (!decoded) {
      throw ConfigError(key +
                        ": expected a Standard Webhooks secret, whsec_ followed by the base64 key; "
                        "the part after whsec_ is not valid base64 (or is empty)");
    }
    c.signing_keys.push_back(std::move(*decoded));
  }
}

void parse_tls(config::Section& s, WebhookSinkConfig& c) {
  auto tls = s.section("tls");
  if (!tls) return;
  c.tls.ca_file = tls->string_or("ca_file", "");
  c.tls.insecure_skip_verify = tls->boolean_or("insecure_skip_verify", c.tls.insecure_skip_verify);
  tls->finish();
  if (c.tls.ca_file.empty()) return;
  std::ifstream in(c.tls.ca_file);
  if (!in) throw ConfigError(tls->key_path("ca_file") + ": cannot read " + c.tls.ca_file);
  std::stringstream text;
  text << in.rdbuf();
  if (text.str().find("-----BEGIN CERTIFICATE-----") == std::string::npos) {
    throw ConfigError(tls->key_path("ca_file") + ": expected a PEM file with at least one CERTIFICATE, in " +
                      c.tls.ca_file);
  }
}

}  // namespace

bool is_reserved_webhook_header(const std::string& name) {
  static const std::set<std::string> kReserved{
      "content-type", "content-length",    "transfer-encoding", "host", "expect", "connection",
      "webhook-id",   "webhook-timestamp", "webhook-signature"};
  return kReserved.count(lower(name)) > 0;
}

bool is_valid_header_name(const std::string& name) {
  static const std::string kSpecials = "!#$%&'*+-.^_`|~";
  if (name.empty()) return false;
  return std::all_of(name.begin(), name.end(), [](char ch) {
    return std::isalnum(static_cast<unsigned char>(ch)) || kSpecials.find(ch) != std::string::npos;
  });
}

bool is_valid_header_value(const std::string& value) {
  return value.find_first_of(std::string("\r\n\0", 3)) == std::string::npos;
}

WebhookSinkConfig parse_webhook_sink(config::Section& s) {
  WebhookSinkConfig c;
  // Secrets first: a later error about another key must not leave one of them unregistered.
  parse_secrets(s, c);
  parse_url(s, c);
  parse_headers(s, c);
  c.timeout = s.duration_or("timeout", c.timeout, std::chrono::milliseconds{100}, std::chrono::minutes{10});
  c.max_in_flight = static_cast<int>(s.integer_or("max_in_flight", c.max_in_flight, 1, kMaxWebhookInFlight));
  c.events_per_request =
      static_cast<int>(s.integer_or("events_per_request", c.events_per_request, 1, kMaxWebhookEventsPerRequest));
  parse_tls(s, c);
  return c;
}

nlohmann::json describe_webhook_sink(const WebhookSinkConfig& c) {
  nlohmann::json headers = nlohmann::json::object();
  for (const auto& [name, value] : c.headers) headers[name] = "*****";
  return {{"url", c.url_for_logs},
          {"headers", headers},
          {"secrets", std::vector<std::string>(c.secrets.size(), "*****")},
          {"timeout", config::format_duration(c.timeout)},
          {"max_in_flight", c.max_in_flight},
          {"events_per_request", c.events_per_request},
          {"tls", {{"ca_file", c.tls.ca_file}, {"insecure_skip_verify", c.tls.insecure_skip_verify}}}};
}

}  // namespace outbox::sinks
