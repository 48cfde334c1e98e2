#pragma once
// type: webhook. Config of the HTTP webhook sink (docs/design.md §5, issue 4):
//   url: https://example.com/hooks        required, http:// or https://
//   headers: {Authorization: "Bearer ${TOKEN}"}   static extra headers; values masked in logs
//   secrets: [whsec_..., whsec_...]       Standard Webhooks keys; one signature per key (rotation)
//   timeout: 10s                          per request, connect included; also bounds a batch
//   max_in_flight: 16                     concurrent requests (and kept-alive connections)
//   events_per_request: 1                 1: one event per request, the payload as the body; more:
//                                         a JSON array of up to that many events (docs/sinks.md)
//   tls: {ca_file: /path/ca.pem, insecure_skip_verify: false}
#include <chrono>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "sinks/envelope.hpp"

namespace outbox::config {
class Section;
}

namespace outbox::sinks {

struct WebhookTlsConfig {
  std::string ca_file;                // empty: the system's CA store; set: only the CAs in this PEM file
  bool insecure_skip_verify = false;  // true: no certificate or host name check (never in production)
};

struct WebhookSinkConfig {
  std::string url;                                           // may carry a password: log url_for_logs instead
  std::string url_for_logs;                                  // url with any password replaced by *****
  std::vector<std::pair<std::string, std::string>> headers;  // static headers, in config order
  std::vector<std::string> secrets;                          // the whsec_ texts as configured: secret, never logged
  std::vector<std::string> signing_keys;                     // their decoded key bytes, in the same order
  std::chrono::milliseconds timeout{10'000};
  int max_in_flight = 16;
  int events_per_request = 1;
  WebhookTlsConfig tls;
  Envelope envelope;  // format: json (the row's headers) or cloudevents (ce-* headers, binary mode)
};

inline constexpr int kMaxWebhookInFlight = 256;
inline constexpr int kMaxWebhookEventsPerRequest = 1000;

// Reads the webhook keys of a sink section. Throws config::ConfigError naming the key: missing
// or non-http(s) url, a secret that is not whsec_<base64>, max_in_flight outside 1..256,
// events_per_request outside 1..1000, an
// unreadable or non-PEM tls.ca_file, a header that is malformed or one the sink sets itself.
// Registers every secret (secrets, url password, credential-like header values) with
// log::add_secret before anything can log it.
WebhookSinkConfig parse_webhook_sink(config::Section& section);

// The effective settings for the startup log: secrets and header values masked as *****.
nlohmann::json describe_webhook_sink(const WebhookSinkConfig& config);

// Header names the sink sets itself; neither the config nor an event's headers may set them.
bool is_reserved_webhook_header(const std::string& name);
// RFC 9110 field-name (token) and field-value (no CR, LF or NUL) checks.
bool is_valid_header_name(const std::string& name);
bool is_valid_header_value(const std::string& value);

}  // namespace outbox::sinks
