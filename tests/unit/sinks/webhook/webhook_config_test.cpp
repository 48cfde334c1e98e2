#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "config/config.hpp"
#include "log/log.hpp"
#include "sinks/webhook/webhook_config.hpp"
#include "support/env.hpp"
#include "support/sinks.hpp"

using namespace outbox;
using namespace outbox::config;
using outbox::sinks::WebhookSinkConfig;
using std::chrono::milliseconds;

namespace {

using outbox::testing::env_of;

const outbox::testing::OneSink<WebhookSinkConfig> entry{"hooks", "webhook", outbox::sinks::parse_webhook_sink,
                                                        "routes:\n  - topics: ['*']\n    sinks: [hooks]\n"};

WebhookSinkConfig parse(const std::string& sink_body, std::map<std::string, std::string> vars = {}) {
  return entry.settings(sink_body, env_of(std::move(vars)));
}

// A temporary file that is removed at scope end.
struct TempFile {
  std::filesystem::path path;
  explicit TempFile(const std::string& content) {
    path = std::filesystem::temp_directory_path() /
           ("webhook-config-test-" + std::to_string(reinterpret_cast<std::uintptr_t>(this)) + ".pem");
    std::ofstream(path) << content;
  }
  ~TempFile() { std::filesystem::remove(path); }
};

const char* kSecretA = "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
const char* kSecretB = "whsec_c2Vjb25kLXNlY3JldC1mb3Itcm90YXRpb24=";

}  // namespace

TEST_CASE("defaults: 10s timeout, 16 in flight, one event a request, TLS verified with the system CAs") {
  const auto c = parse("    url: https://hooks.example.com/outbox\n");
  CHECK(c.url == "https://hooks.example.com/outbox");
  CHECK(c.url_for_logs == "https://hooks.example.com/outbox");
  CHECK(c.timeout == milliseconds(10'000));
  CHECK(c.max_in_flight == 16);
  CHECK(c.events_per_request == 1);
  CHECK(c.tls.ca_file.empty());
  CHECK_FALSE(c.tls.insecure_skip_verify);
  CHECK(c.secrets.empty());
  CHECK(c.signing_keys.empty());
  CHECK(c.headers.empty());
}

TEST_CASE("every key parses, with ${ENV} interpolation") {
  TempFile ca("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  const auto c = parse(
      "    url: http://127.0.0.1:${PORT}/hook\n"
      "    headers: {Authorization: 'Bearer ${TOKEN}', X-Team: payments}\n"
      "    secrets: ['${SECRET_A}', " +
          std::string(kSecretB) +
          "]\n"
          "    timeout: 2500ms\n"
          "    max_in_flight: 64\n"
          "    events_per_request: 50\n"
          "    tls: {ca_file: " +
          ca.path.string() + ", insecure_skip_verify: true}\n",
      {{"PORT", "8080"}, {"TOKEN", "tok-123456"}, {"SECRET_A", kSecretA}});
  CHECK(c.url == "http://127.0.0.1:8080/hook");
  REQUIRE(c.headers.size() == 2);
  CHECK(c.headers[0] == std::pair<std::string, std::string>{"Authorization", "Bearer tok-123456"});
  CHECK(c.headers[1] == std::pair<std::string, std::string>{"X-Team", "payments"});
  CHECK(c.secrets == std::vector<std::string>{kSecretA, kSecretB});
  REQUIRE(c.signing_keys.size() == 2);
  CHECK(c.signing_keys[0].size() == 24);
  CHECK(c.signing_keys[1] == "second-secret-for-rotation");
  CHECK(c.timeout == milliseconds(2500));
  CHECK(c.max_in_flight == 64);
  CHECK(c.events_per_request == 50);
  CHECK(c.tls.ca_file == ca.path.string());
  CHECK(c.tls.insecure_skip_verify);
}

TEST_CASE("a token in the URL's query is masked in the logged URL, its parameter names kept") {
  CHECK(parse("    url: https://hooks.example.com/in?token=t0ken-abc&team=payments&flag\n").url_for_logs ==
        "https://hooks.example.com/in?token=*****&team=*****&*****");
  CHECK(parse("    url: https://hooks.example.com/in?token=t0ken-abc\n").url ==
        "https://hooks.example.com/in?token=t0ken-abc");
}

TEST_CASE("secrets never reach the logs, nor the described config") {
  const auto c = parse(
      "    url: https://user:p4ssw0rd-xyz@hooks.example.com/outbox\n"
      "    headers: {Authorization: Bearer s3cr3t-token-value, X-Team: payments}\n"
      "    secrets: [" +
      std::string(kSecretA) + "]\n");
  CHECK(c.url_for_logs.find("p4ssw0rd-xyz") == std::string::npos);
  CHECK(c.url_for_logs.find("*****") != std::string::npos);
  const std::string described = sinks::describe_webhook_sink(c).dump();
  for (const char* secret : {kSecretA, "p4ssw0rd-xyz", "s3cr3t-token-value", "payments"}) {
    CAPTURE(secret);
    CHECK(described.find(secret) == std::string::npos);
  }
  CHECK(described.find("\"max_in_flight\":16") != std::string::npos);
  // Registered with the log redactor at parse time.
  CHECK(log::redact(std::string("x ") + kSecretA + " y") == "x ***** y");
  CHECK(log::redact("pw p4ssw0rd-xyz") == "pw *****");
  CHECK(log::redact("Bearer s3cr3t-token-value") == "*****");

  // describe() of the whole config carries the webhook entry, masked.
  const Config whole =
      entry.config("    url: https://hooks.example.com/x\n    secrets: [" + std::string(kSecretB) + "]\n");
  const std::string all = outbox::testing::describe_with_sinks(whole).dump();
  CHECK(all.find("https://hooks.example.com/x") != std::string::npos);
  CHECK(all.find(kSecretB) == std::string::npos);
  CHECK(all.find("\"secrets\":[\"*****\"]") != std::string::npos);
}

TEST_CASE("bad config names the key") {
  struct Row {
    std::string body;
    std::string expected;  // a part of the message
  };
  const std::vector<Row> table{
      {"    timeout: 1s\n", "sinks[0].url: required, but missing"},
      {"    url: ''\n", "sinks[0].url: required, but missing"},
      {"    url: not a url\n", "sinks[0].url: expected an absolute http:// or https:// URL"},
      {"    url: ftp://example.com/x\n", "sinks[0].url: unsupported scheme 'ftp', expected one of: http, https"},
      {"    url: https://x/\n    secrets: [plainsecretvalue]\n",
       "sinks[0].secrets[0]: expected a Standard Webhooks secret, whsec_ followed by the base64 key; the value does "
       "not start with whsec_"},
      {"    url: https://x/\n    secrets: [" + std::string(kSecretA) + ", 'whsec_not*base64']\n",
       "sinks[0].secrets[1]: expected a Standard Webhooks secret, whsec_ followed by the base64 key; the part after "
       "whsec_ is not valid base64"},
      {"    url: https://x/\n    secrets: [whsec_]\n", "sinks[0].secrets[0]: expected a Standard Webhooks secret"},
      {"    url: https://x/\n    secrets: whsec_Zm9v\n", "sinks[0].secrets: expected a list of strings"},
      {"    url: https://x/\n    max_in_flight: 0\n",
       "sinks[0].max_in_flight: expected a whole number from 1 to 256, got '0'"},
      {"    url: https://x/\n    max_in_flight: 257\n",
       "sinks[0].max_in_flight: expected a whole number from 1 to 256"},
      {"    url: https://x/\n    max_in_flight: many\n", "sinks[0].max_in_flight: expected a whole number"},
      {"    url: https://x/\n    events_per_request: 0\n",
       "sinks[0].events_per_request: expected a whole number from 1 to 1000, got '0'"},
      {"    url: https://x/\n    events_per_request: 1001\n",
       "sinks[0].events_per_request: expected a whole number from 1 to 1000"},
      {"    url: https://x/\n    timeout: 10\n", "sinks[0].timeout: expected a duration"},
      {"    url: https://x/\n    timeout: 50ms\n", "sinks[0].timeout: expected a duration from 100ms to 10m, got 50ms"},
      {"    url: https://x/\n    tls: {ca_file: /nonexistent/ca.pem}\n",
       "sinks[0].tls.ca_file: cannot read /nonexistent/ca.pem"},
      {"    url: https://x/\n    tls: {insecure_skip_verify: yes please}\n",
       "sinks[0].tls.insecure_skip_verify: expected true or false"},
      {"    url: https://x/\n    tls: {verify: false}\n", "sinks[0].tls.verify: unknown key"},
      {"    url: https://x/\n    retries: 3\n", "sinks[0].retries: unknown key"},
      {"    url: https://x/\n    headers: {webhook-id: x}\n",
       "sinks[0].headers.webhook-id: the webhook sink sets this header itself"},
      {"    url: https://x/\n    headers: {Content-Type: text/plain}\n",
       "sinks[0].headers.Content-Type: the webhook sink sets this header itself"},
      {"    url: https://x/\n    headers: {'Bad Name': x}\n",
       "sinks[0].headers.Bad Name: not a valid HTTP header name"},
      {"    url: https://x/\n    headers: {X-A: \"a\\r\\nX-Injected: 1\"}\n",
       "sinks[0].headers.X-A: header values must not contain CR, LF or NUL"},
      {"    url: https://x/\n    headers: {X-A: 1, x-a: 2}\n", "duplicate header"},
      {"    url: https://x/\n    secrets: ['${MISSING}']\n",
       "sinks[0].secrets[0]: environment variable MISSING is not set"},
  };
  for (const auto& row : table) {
    CAPTURE(row.body);
    const std::string error = entry.error_of(row.body);
    CHECK_MESSAGE(error.find(row.expected) != std::string::npos, error);
  }
}

TEST_CASE("a ca_file must hold a PEM certificate") {
  TempFile not_pem("hello\n");
  const std::string error = entry.error_of("    url: https://x/\n    tls: {ca_file: " + not_pem.path.string() + "}\n");
  CHECK(error.find("sinks[0].tls.ca_file: expected a PEM file with at least one CERTIFICATE") != std::string::npos);
}

TEST_CASE("an invalid secret is not echoed in the error") {
  const std::string error = entry.error_of("    url: https://x/\n    secrets: [supersecretvalue123]\n");
  CHECK(error.find("supersecretvalue123") == std::string::npos);
  CHECK(log::redact(error) == error);
  CHECK(log::redact("supersecretvalue123") == "*****");  // registered before the check failed
}

TEST_CASE("header helpers") {
  CHECK(sinks::is_valid_header_name("X-Request-Id"));
  CHECK(sinks::is_valid_header_name("x_custom.v2~"));
  CHECK_FALSE(sinks::is_valid_header_name(""));
  CHECK_FALSE(sinks::is_valid_header_name("X Bad"));
  CHECK_FALSE(sinks::is_valid_header_name("X:Bad"));
  CHECK_FALSE(sinks::is_valid_header_name("X-\xc3\xa9"));
  CHECK(sinks::is_valid_header_value(""));
  CHECK(sinks::is_valid_header_value("a b\tc"));
  CHECK_FALSE(sinks::is_valid_header_value("a\r\nb"));
  CHECK_FALSE(sinks::is_valid_header_value(std::string("a\0b", 3)));
  CHECK(sinks::is_reserved_webhook_header("Webhook-Signature"));
  CHECK(sinks::is_reserved_webhook_header("CONTENT-TYPE"));
  CHECK_FALSE(sinks::is_reserved_webhook_header("Authorization"));
}
