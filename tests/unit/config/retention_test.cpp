// relay.retention, relay.retention_interval and http.refresh_interval: parsing, limits, describe().
#include <doctest/doctest.h>

#include <string>

#include "config/config.hpp"
#include "support/env.hpp"

using namespace outbox;
using namespace std::chrono_literals;
using config::ConfigError;

namespace {

config::Config parse(const std::string& yaml) {
  return config::parse_config("database: {url: 'postgresql://u@h/db'}\n" + yaml, outbox::testing::env_of());
}

std::string error_of(const std::string& yaml) {
  return outbox::testing::config_error_of([&] { parse(yaml); });
}

}  // namespace

TEST_CASE("relay.retention is off unless set") {
  const auto c = parse("");
  CHECK_FALSE(c.relay.retention.has_value());
  CHECK(c.relay.retention_interval == 1s);
  CHECK(config::describe(c)["relay"]["retention"] == "off");
  CHECK_FALSE(parse("relay: {retention: off}").relay.retention.has_value());
  CHECK_FALSE(parse("relay: {retention: ~}").relay.retention.has_value());
}

TEST_CASE("relay.retention takes a duration") {
  CHECK(*parse("relay: {retention: 168h}").relay.retention == 168h);
  CHECK(*parse("relay: {retention: 7d}").relay.retention == 168h);
  CHECK(*parse("relay: {retention: 1s}").relay.retention == 1s);
  const auto c = parse("relay: {retention: 36h, retention_interval: 30s}");
  CHECK(*c.relay.retention == 36h);
  CHECK(c.relay.retention_interval == 30s);
  CHECK(config::describe(c)["relay"]["retention"] == "1d12h");
  CHECK(config::describe(c)["relay"]["retention_interval"] == "30s");
}

TEST_CASE("relay.retention_interval defaults to a pass a second, whatever the retention") {
  CHECK(parse("relay: {retention: 2m}").relay.retention_interval == 1s);
  CHECK(parse("relay: {retention: 168h}").relay.retention_interval == 1s);
  CHECK(parse("relay: {retention: 2s}").relay.retention_interval == 1s);
  CHECK(parse("relay: {retention: 2m, retention_interval: 10m}").relay.retention_interval == 10min);
}

TEST_CASE("relay.retention errors name the key and what is expected") {
  for (const char* bad : {"168", "forever", "-1h", "500ms", "0s", "true"}) {
    CAPTURE(bad);
    const auto error = error_of(std::string("relay: {retention: '") + bad + "'}");
    CHECK(error.find("relay.retention:") == 0);
    CHECK(error.find("expected a duration of at least 1s") != std::string::npos);
    CHECK(error.find(bad) != std::string::npos);
  }
  CHECK(error_of("relay: {retention_interval: 200ms}").find("relay.retention_interval: must be at least 1s") == 0);
  CHECK(error_of("relay: {retention_interval: soon}").find("relay.retention_interval:") == 0);
  CHECK(error_of("relay: {retention: {older_than: 7d}}").find("relay.retention: expected a single value") == 0);
}

TEST_CASE("relay.retention reads ${ENV}") {
  const auto env = [](const std::string& name) -> std::optional<std::string> {
    if (name == "RETENTION") return "72h";
    return std::nullopt;
  };
  const auto c = config::parse_config("database: {url: x}\nrelay: {retention: '${RETENTION}'}", env);
  CHECK(*c.relay.retention == 72h);
  const auto off = config::parse_config("database: {url: x}\nrelay: {retention: '${UNSET:-off}'}", env);
  CHECK_FALSE(off.relay.retention.has_value());
}

TEST_CASE("http.refresh_interval and http.listen") {
  const auto c = parse("");
  CHECK(c.http.refresh_interval == 10s);
  CHECK(c.http.listen == "127.0.0.1:9187");
  CHECK(parse("http: {refresh_interval: 250ms}").http.refresh_interval == 250ms);
  CHECK(config::describe(parse("http: {refresh_interval: 2s}"))["http"]["refresh_interval"] == "2s");
  CHECK(error_of("http: {refresh_interval: 10ms}").find("http.refresh_interval: must be at least 100ms") == 0);
  CHECK(error_of("http: {listen: '127.0.0.1:70000'}").find("http.listen: expected host:port") == 0);
  CHECK(parse("http: {listen: '0.0.0.0:65535'}").http.listen == "0.0.0.0:65535");
  CHECK(parse("http: {listen: '[::1]:9187'}").http.listen == "[::1]:9187");
}
