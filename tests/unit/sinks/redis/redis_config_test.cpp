// Parsing and describing `type: redis` sink entries.
#include <doctest/doctest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "config/config.hpp"
#include "log/log.hpp"
#include "sinks/redis/redis_config.hpp"
#include "sinks/registry.hpp"
#include "support/env.hpp"
#include "support/sinks.hpp"

using namespace outbox;
using config::ConfigError;

namespace {

using outbox::testing::env_of;

const outbox::testing::OneSink<sinks::RedisSinkConfig> entry{"r", "redis", sinks::parse_redis_sink};

std::string temp_file(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

}  // namespace

TEST_CASE("redis config: defaults") {
  const auto c = entry.settings("    url: redis://127.0.0.1\n");
  CHECK_FALSE(c.tls);
  CHECK(c.host == "127.0.0.1");
  CHECK(c.port == 6379);
  CHECK(c.db == 0);
  CHECK(c.username.empty());
  CHECK(c.password.empty());
  CHECK(c.stream == "{topic}");
  CHECK_FALSE(c.maxlen.has_value());
  CHECK(c.timeout == std::chrono::seconds{5});
  CHECK(c.key_path == "sinks[0]");
  CHECK(c.url_for_logs == "redis://127.0.0.1:6379/0");
}

TEST_CASE("redis config: every key") {
  const auto ca =
      temp_file("redis-config-test-ca.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  const auto key =
      temp_file("redis-config-test-key.pem", "-----BEGIN PRIVATE KEY-----\nMIIE\n-----END PRIVATE KEY-----\n");
  const auto c = entry.settings(
      "    url: 'rediss://relay:${REDIS_PW}@redis.example.com:6380/2'\n"
      "    stream: 'outbox.{topic}.v1'\n"
      "    maxlen: 100000\n"
      "    timeout: 2s\n"
      "    tls: {ca_file: '" +
          ca + "', cert_file: '" + ca + "', key_file: '" + key + "', insecure_skip_verify: false}\n",
      env_of({{"REDIS_PW", "p%40ss-w0rd-redis"}}));
  CHECK(c.tls);
  CHECK(c.host == "redis.example.com");
  CHECK(c.port == 6380);
  CHECK(c.db == 2);
  CHECK(c.username == "relay");
  CHECK(c.password == "p@ss-w0rd-redis");  // percent-decoded
  CHECK(c.stream == "outbox.{topic}.v1");
  CHECK(c.maxlen == 100000);
  CHECK(c.timeout == std::chrono::seconds{2});
  CHECK(c.tls_files.ca_file == ca);
  CHECK(c.tls_files.cert_file == ca);
  CHECK(c.tls_files.key_file == key);
  CHECK(c.url_for_logs == "rediss://relay:*****@redis.example.com:6380/2");
}

TEST_CASE("redis config: password-only URLs and IPv6 hosts") {
  const auto colon = entry.settings("    url: 'redis://:only-password-1@h:7000'\n");
  CHECK(colon.username.empty());
  CHECK(colon.password == "only-password-1");
  CHECK(colon.port == 7000);
  const auto bare = entry.settings("    url: 'redis://only-password-2@h'\n");  // as redis-cli and redis-py read it
  CHECK(bare.username.empty());
  CHECK(bare.password == "only-password-2");
  CHECK(bare.url_for_logs == "redis://:*****@h:6379/0");
  const auto v6 = entry.settings("    url: 'redis://[::1]:6390/1'\n");
  CHECK(v6.host == "::1");
  CHECK(v6.port == 6390);
  CHECK(v6.db == 1);
  CHECK(v6.url_for_logs == "redis://[::1]:6390/1");
  CHECK(entry.settings("    url: 'redis://user-no-password@h'\n").password == "user-no-password");
}

TEST_CASE("redis config: every error names its key") {
  const auto ca =
      temp_file("redis-config-test-ca2.pem", "-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n");
  const auto not_pem = temp_file("redis-config-test-not-pem.txt", "hello\n");
  struct Case {
    std::string yaml;
    std::string expected;
  };
  const std::vector<Case> cases{
      {"    stream: x\n", "sinks[0].url: required"},
      {"    url: 'http://h:6379'\n", "sinks[0].url: unsupported scheme"},
      {"    url: 'redis://'\n", "sinks[0].url: the URL has no host"},
      {"    url: 'redis://:pw@:6379'\n", "sinks[0].url: the URL has no host"},
      {"    url: 'redis://h:0'\n", "sinks[0].url: the port must be a number from 1 to 65535"},
      {"    url: 'redis://h:65536'\n", "sinks[0].url: the port must be a number from 1 to 65535"},
      {"    url: 'redis://h:abc'\n", "sinks[0].url: the port must be a number from 1 to 65535"},
      {"    url: 'redis://h:'\n", "sinks[0].url: the port must be a number from 1 to 65535"},
      {"    url: 'redis://h/db1'\n", "sinks[0].url: the path must be a database number"},
      {"    url: 'redis://h?ssl=true'\n", "sinks[0].url: query strings and fragments are not supported"},
      {"    url: 'redis://[::1:6379'\n", "sinks[0].url: unterminated [IPv6] host"},
      {"    url: 'redis://u:%zz@h'\n", "sinks[0].url: malformed %-escape"},
      {"    url: redis://h\n    stream: ''\n", "sinks[0].stream: must not be empty"},
      {"    url: redis://h\n    stream: 'outbox.{topc}'\n", "sinks[0].stream: unexpected '{' at position 7"},
      {"    url: redis://h\n    stream: 'a}'\n", "sinks[0].stream: unexpected '}' at position 1"},
      {"    url: redis://h\n    maxlen: 0\n", "sinks[0].maxlen: expected a whole number from 1"},
      {"    url: redis://h\n    maxlen: lots\n", "sinks[0].maxlen: expected a whole number from 1"},
      {"    url: redis://h\n    timeout: 50ms\n", "sinks[0].timeout: expected a duration from 100ms to 10m, got 50ms"},
      {"    url: redis://h\n    timeout: 11m\n", "sinks[0].timeout: expected a duration from 100ms to 10m"},
      {"    url: redis://h\n    timeout: soon\n", "sinks[0].timeout: expected a duration"},
      {"    url: redis://h\n    tls: {insecure_skip_verify: true}\n",
       "sinks[0].tls: TLS settings apply to rediss:// urls only"},
      {"    url: rediss://h\n    tls: {ca_file: /nonexistent/ca.pem}\n",
       "sinks[0].tls.ca_file: cannot read /nonexistent/ca.pem"},
      {"    url: rediss://h\n    tls: {ca_file: '" + not_pem + "'}\n", "sinks[0].tls.ca_file: expected a PEM file"},
      {"    url: rediss://h\n    tls: {cert_file: '" + ca + "'}\n",
       "sinks[0].tls.key_file: cert_file and key_file go together"},
      {"    url: rediss://h\n    tls: {key_file: '" + ca + "'}\n",
       "sinks[0].tls.cert_file: cert_file and key_file go together"},
      {"    url: rediss://h\n    tls: {cert_file: '" + ca + "', key_file: '" + not_pem + "'}\n",
       "sinks[0].tls.key_file: expected a PEM file"},
      {"    url: rediss://h\n    tls: {insecure_skip_verfy: true}\n", "sinks[0].tls.insecure_skip_verfy: unknown key"},
      {"    url: rediss://h\n    tls: {insecure_skip_verify: maybe}\n",
       "sinks[0].tls.insecure_skip_verify: expected true or false"},
      {"    url: redis://h\n    strem: x\n", "sinks[0].strem: unknown key"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.yaml);
    CHECK(entry.error_of(c.yaml).find(c.expected) != std::string::npos);
  }
}

TEST_CASE("redis config: an error about the URL never echoes it") {
  for (const char* url : {"'htp://u:hunter2-redis-a@h'", "'redis://u:hunter2-redis-b@h:99999'",
                          "'redis://u:hunter2-redis-c@h/x'", "'redis://u:hunter2-redis-d@h?x=1'"}) {
    const std::string error = entry.error_of(std::string("    url: ") + url + "\n");
    CAPTURE(error);
    CHECK(error.find("sinks[0].url") == 0);
    CHECK(error.find("hunter2") == std::string::npos);
  }
}

TEST_CASE("redis config: the password is masked in describe() and in every log line") {
  const auto c = entry.config("    url: 'redis://relay:s3cr3t-redis-pw@h:6379/3'\n    maxlen: 500\n");
  const auto all = outbox::testing::describe_with_sinks(c);
  CHECK(all.dump().find("s3cr3t-redis-pw") == std::string::npos);
  const auto j = all["sinks"][0];
  CHECK(j["type"] == "redis");
  CHECK(j["url"] == "redis://relay:*****@h:6379/3");
  CHECK(j["stream"] == "{topic}");
  CHECK(j["maxlen"] == 500);
  CHECK(j["timeout"] == "5s");
  CHECK_FALSE(j.contains("tls"));
  CHECK(log::redact("AUTH relay s3cr3t-redis-pw") == "AUTH relay *****");
  // Percent-encoded in the URL, registered decoded: both forms are masked.
  entry.config("    url: 'rediss://:pw%2Fwith%2Fslash-x@h'\n");
  CHECK(log::redact("pw/with/slash-x and pw%2Fwith%2Fslash-x") == "***** and *****");

  const auto tls = outbox::testing::describe_with_sinks(entry.config("    url: 'rediss://h'\n"))["sinks"][0];
  CHECK(tls["url"] == "rediss://h:6379/0");
  CHECK(tls["tls"]["insecure_skip_verify"] == false);
}

TEST_CASE("redis config: stream templates") {
  CHECK_FALSE(sinks::check_stream_template("{topic}"));
  CHECK_FALSE(sinks::check_stream_template("outbox:{topic}:events"));
  CHECK_FALSE(sinks::check_stream_template("all-events"));
  CHECK(sinks::check_stream_template("{key}"));
  CHECK(sinks::render_stream("outbox.{topic}", "order.paid") == "outbox.order.paid");
  CHECK(sinks::render_stream("{topic}/{topic}", "t") == "t/t");
  CHECK(sinks::render_stream("fixed", "t") == "fixed");
}
