#include <doctest/doctest.h>

#include <map>
#include <string>

#include "config/config.hpp"
#include "sinks/file/file_config.hpp"
#include "support/env.hpp"
#include "support/sinks.hpp"

using namespace outbox::config;
using std::chrono::milliseconds;

namespace {

using outbox::testing::env_of;

// The message of the ConfigError that parsing throws, or "" if it parses.
std::string error_of(const std::string& yaml, std::map<std::string, std::string> vars = {}) {
  return outbox::testing::config_error_of([&] { outbox::testing::parse_with_sinks(yaml, env_of(std::move(vars))); },
                                          "");
}

const char* kIssueExample = R"(
database:
  url: postgresql://relay@127.0.0.1:5432/app
  channel: outbox_wakeup
  table: outbox_events
relay:
  batch_size: 500
  lease: 60s
  sweep_interval: 30s
  max_attempts: 20
  backoff: { initial: 1s, max: 5m }
  on_success: mark
sinks:
  - name: audit
    type: file
    path: /var/lib/outbox/events.jsonl
routes:
  - topics: ["order.*"]
    sinks: [audit]
)";

}  // namespace

TEST_CASE("the documented example parses into typed values") {
  const Config c = parse_config(kIssueExample, env_of({}));
  CHECK(c.database.url == "postgresql://relay@127.0.0.1:5432/app");
  CHECK(c.database.channel == "outbox_wakeup");
  CHECK(c.database.roles == "outbox");
  CHECK(c.relay.batch_size == 500);
  CHECK(c.relay.lease == milliseconds(60'000));
  CHECK(c.relay.sweep_interval == milliseconds(30'000));
  CHECK(c.relay.max_attempts == 20);
  CHECK(c.relay.backoff.initial == milliseconds(1000));
  CHECK(c.relay.backoff.max == milliseconds(300'000));
  CHECK(c.relay.on_success == OnSuccess::kMark);
  REQUIRE(c.sinks.size() == 1);
  CHECK(c.sinks[0].name == "audit");
  CHECK(c.sinks[0].type == "file");
  CHECK(outbox::testing::sink_settings(c, 0, outbox::sinks::parse_file_sink).path == "/var/lib/outbox/events.jsonl");
  REQUIRE(c.routes.size() == 1);
  CHECK(c.routes[0].topics == std::vector<std::string>{"order.*"});
  CHECK(c.routes[0].sinks == std::vector<std::string>{"audit"});
}

TEST_CASE("defaults fill everything but the url and sinks") {
  const Config c = parse_config("sinks: [{name: out, type: stdout}]", env_of({{"DATABASE_URL", "postgresql://x/db"}}));
  CHECK(c.database.url == "postgresql://x/db");
  CHECK(c.database.table == "outbox_events");
  CHECK(c.database.channel == "outbox_wakeup");
  CHECK(c.relay.batch_size == 500);
  CHECK(c.relay.poll_interval == milliseconds(5));
  CHECK(c.relay.idle_poll_interval == milliseconds(100));
  CHECK(c.relay.light_poll_interval == milliseconds(8));
  CHECK(c.relay.light_poll_events == 8);
  CHECK(c.relay.idle_watch);
  CHECK(c.relay.on_success == OnSuccess::kMark);
  CHECK(c.relay.writer_hold_warning == milliseconds(5'000));
  CHECK(c.http.listen == "127.0.0.1:9187");
  CHECK(c.routes.empty());
}

TEST_CASE("light_poll_interval left out follows a longer poll_interval and a shorter idle_poll_interval") {
  const auto env = env_of({{"DATABASE_URL", "postgresql://x/db"}});
  const std::string sinks = "sinks: [{name: out, type: stdout}]\n";
  CHECK(parse_config("relay: {poll_interval: 20ms}\n" + sinks, env).relay.light_poll_interval == milliseconds(20));
  CHECK(parse_config("relay: {poll_interval: 1ms, idle_poll_interval: 3ms}\n" + sinks, env).relay.light_poll_interval ==
        milliseconds(3));
  CHECK(parse_config("relay: {light_poll_interval: 5ms}\n" + sinks, env).relay.light_poll_interval == milliseconds(5));
  CHECK(parse_config("relay: {light_poll_events: 16}\n" + sinks, env).relay.light_poll_events == 16);
  CHECK_FALSE(parse_config("relay: {idle_watch: false}\n" + sinks, env).relay.idle_watch);
  CHECK(parse_config("relay: {writer_hold_warning: 30s}\n" + sinks, env).relay.writer_hold_warning ==
        milliseconds(30'000));
}

TEST_CASE("--database-url wins over the file, DATABASE_URL only fills a gap") {
  const std::string yaml = "database: {url: postgresql://file/db}\nsinks: [{name: o, type: stdout}]";
  CHECK(parse_config(yaml, env_of({{"DATABASE_URL", "postgresql://env/db"}})).database.url == "postgresql://file/db");
  CHECK(parse_config(yaml, env_of({}), "postgresql://flag/db").database.url == "postgresql://flag/db");
}

TEST_CASE("${ENV} interpolation works in every value, with defaults and files") {
  const Config c = parse_config(
      "database: {url: 'postgresql://relay:${PW}@${HOST:-localhost}/app'}\n"
      "relay: {batch_size: '${BATCH}', lease: '${LEASE:-90s}'}\n"
      "sinks: [{name: out, type: file, path: '${DIR}/events.jsonl'}]",
      env_of({{"PW", "s3cret"}, {"BATCH", "250"}, {"DIR", "/data"}}));
  CHECK(c.database.url == "postgresql://relay:s3cret@localhost/app");
  CHECK(c.relay.batch_size == 250);
  CHECK(c.relay.lease == milliseconds(90'000));
  CHECK(outbox::testing::sink_settings(c, 0, outbox::sinks::parse_file_sink).path == "/data/events.jsonl");
}

TEST_CASE("each bad config names its key and what was expected") {
  const std::string sinks = "\nsinks: [{name: a, type: stdout}]";
  const std::string url = "database: {url: postgresql://x/db}\n";
  struct Case {
    std::string yaml;
    std::string expected;
  };
  const Case cases[] = {
      {url + "relay: {lease: 60}" + sinks, "relay.lease: expected a duration"},
      {"database: {url: postgresql://x/db, roles: Billing}" + sinks,
       "database.roles: expected a lower-case SQL identifier of at most 56 characters, got 'Billing'"},
      {url + "relay: {writer_hold_warning: later}" + sinks, "relay.writer_hold_warning: expected a duration"},
      {url + "relay: {sweep_interval: soon}" + sinks, "relay.sweep_interval: expected a duration"},
      {url + "relay: {batch_size: 0}" + sinks, "relay.batch_size: expected a whole number from 1"},
      {url + "relay: {batch_size: lots}" + sinks, "relay.batch_size: expected a whole number"},
      {url + "relay: {on_success: archive}" + sinks,
       "relay.on_success: unsupported value 'archive', expected one of: mark, delete"},
      {url + "relay: {backof: {initial: 1s}}" + sinks, "relay.backof: unknown key"},
      {url + "relay: {backoff: {initial: 10s, max: 1s}}" + sinks, "relay.backoff.max: must not be shorter"},
      {url + "relay: {lease: 10ms}" + sinks, "relay.lease: must be at least 100ms"},
      {url + "relay: {poll_interval: 0ms}" + sinks, "relay.poll_interval: expected a duration from 1ms to 10s"},
      {url + "relay: {idle_poll_interval: 1m}" + sinks,
       "relay.idle_poll_interval: expected a duration from 1ms to 10s"},
      {url + "relay: {poll_interval: 50ms, idle_poll_interval: 20ms}" + sinks,
       "relay.idle_poll_interval: must not be shorter than relay.poll_interval"},
      {url + "relay: {poll_interval: 10ms, light_poll_interval: 5ms}" + sinks,
       "relay.light_poll_interval: must not be shorter than relay.poll_interval"},
      {url + "relay: {light_poll_interval: 200ms}" + sinks,
       "relay.light_poll_interval: must not be longer than relay.idle_poll_interval"},
      {url + "relay: {light_poll_interval: 20s}" + sinks,
       "relay.light_poll_interval: expected a duration from 1ms to 10s"},
      {url + "relay: {light_poll_events: 0}" + sinks,
       "relay.light_poll_events: expected a whole number from 1 to 10000, got '0'"},
      {url + "relay: {idle_watch: sometimes}" + sinks, "relay.idle_watch: expected true or false"},
      {url + "databse: {}" + sinks, "databse: unknown key"},
      {"database: {url: postgresql://x/db, tabel: t}" + sinks, "database.tabel: unknown key"},
      {"database: {url: postgresql://x/db, table: 'Bad-Name'}" + sinks,
       "database.table: expected a lower-case table name"},
      {"relay: {}" + sinks, "database.url: required"},
      {url + "sinks: [{name: a, type: carrier-pigeon}]", "sinks[0].type: unsupported value 'carrier-pigeon'"},
      {url + "sinks: [{name: a, type: file}]", "sinks[0].path: required"},
      {url + "sinks: [{name: a, type: stdout, colour: red}]", "sinks[0].colour: unknown key"},
      {url + "sinks: [{name: a, type: stdout}, {name: a, type: stdout}]", "sinks[1].name: duplicate sink name 'a'"},
      {url + "sinks: [{name: a, type: stdout}]\nroutes: [{topics: ['x.*'], sinks: [b]}]",
       "routes[0].sinks[0]: unknown sink 'b'"},
      {url + "sinks: [{name: a, type: stdout}]\nroutes: [{sinks: [a]}]", "routes[0].topics: expected a non-empty list"},
      {url + "http: {listen: 9187}" + sinks, "http.listen: expected host:port"},
      {"database: {url: '${NOPE}'}" + sinks, "database.url: environment variable NOPE is not set"},
      {"database: {url: [a, b]}" + sinks, "database.url: expected a single value"},
      {"database: [x" + sinks, "config: not valid YAML"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.yaml);
    const std::string message = error_of(c.yaml);
    CHECK_MESSAGE(message.find(c.expected) != std::string::npos, message);
  }
}

TEST_CASE("describe masks the database url") {
  const Config c = parse_config(kIssueExample, env_of({}));
  const std::string text = describe(c).dump();
  CHECK(text.find("postgresql://") == std::string::npos);
  CHECK(text.find("\"batch_size\":500") != std::string::npos);
}

TEST_CASE("--table is checked like database.table and taken literally") {
  CHECK(table_option("outbox_events") == "outbox_events");
  CHECK(table_option("app.outbox_events") == "app.outbox_events");
  CHECK(table_option("\"app.outbox_events\"") == "app.outbox_events");  // one pair of quotes, as before
  CHECK(table_option("'events'") == "events");
  struct Case {
    std::string value;
    std::string expected;
  };
  const Case cases[] = {
      // No ${...} interpolation: the text is the name, and the error shows it as typed.
      {"\"${HOME}\"", "--table: expected a lower-case table name (optionally schema.table), got '${HOME}'"},
      {"\"${file:/etc/hostname}\"",
       "--table: expected a lower-case table name (optionally schema.table), got '${file:/etc/hostname}'"},
      // No YAML: a second key cannot ride along.
      {"outbox_events, table: x",
       "--table: expected a lower-case table name (optionally schema.table), got 'outbox_events, table: x'"},
      {"{table: x}", "--table: expected a lower-case table name (optionally schema.table), got '{table: x}'"},
      {"Outbox", "--table: expected a lower-case table name (optionally schema.table), got 'Outbox'"},
      {"a.b.c", "--table: expected a lower-case table name (optionally schema.table), got 'a.b.c'"},
      {"\"events'", "--table: expected a lower-case table name (optionally schema.table), got '\"events''"},
      {"\"\"", "--table: expected a lower-case table name (optionally schema.table), got ''"},
  };
  for (const auto& c : cases) {
    CAPTURE(c.value);
    std::string message;
    try {
      table_option(c.value);
    } catch (const ConfigError& e) {
      message = e.what();
    }
    CHECK(message == c.expected);
  }
}

TEST_CASE("database.table and --table share one rule") {
  const std::string sinks = "\nsinks: [{name: a, type: stdout}]";
  for (const std::string table : {"app.outbox_events", "outbox_events"}) {
    CAPTURE(table);
    CHECK(error_of("database: {url: postgresql://x/db, table: '" + table + "'}" + sinks).empty());
    CHECK(table_option(table) == table);
  }
  CHECK(error_of("database: {url: postgresql://x/db, table: 'a.b.c'}" + sinks) ==
        "database.table: expected a lower-case table name (optionally schema.table), got 'a.b.c'");
}

TEST_CASE("database.reconnect: the sessions' reconnect backoff, checked") {
  const std::string base = "sinks: [{name: out, type: stdout}]\ndatabase:\n  url: postgresql://x/db\n";
  const Config d = parse_config(base, env_of({}));
  CHECK(d.database.reconnect.initial == milliseconds(500));
  CHECK(d.database.reconnect.max == milliseconds(30'000));
  const Config c = parse_config(base + "  reconnect: {initial: 100ms, max: 2s}\n", env_of({}));
  CHECK(c.database.reconnect.initial == milliseconds(100));
  CHECK(c.database.reconnect.max == milliseconds(2'000));
  CHECK(error_of(base + "  reconnect: {initial: 2s, max: 1s}\n") ==
        "database.reconnect.max: must not be shorter than database.reconnect.initial");
  CHECK(error_of(base + "  reconnect: {initial: 0ms}\n") ==
        "database.reconnect.initial: expected a duration of at least 1ms, got 0s");
  CHECK(error_of(base + "  reconnect: {maximum: 1s}\n").find("database.reconnect.maximum") != std::string::npos);
}

TEST_CASE("config check: every error is collected, and each gets the line of its key") {
  const std::string yaml =
      "database: {url: postgresql://x/db}\n"
      "relay:\n"
      "  batch_size: 0\n"
      "sinks:\n"
      "  - {name: a, type: stdout}\n"
      "  - name: b\n"
      "    type: stdout\n"
      "    colour: red\n"
      "routes: [{topics: ['x'], sinks: [c]}]\n";
  std::vector<std::string> errors;
  const Config c = parse_config(yaml, env_of({}), "", &errors);
  REQUIRE(errors.size() == 2);
  CHECK(outbox::config::with_line(yaml, errors[0]).starts_with("line 3: relay.batch_size: expected"));
  CHECK(outbox::config::with_line(yaml, errors[1]).starts_with("line 9: routes[0].sinks[0]: unknown sink 'c'"));
  CHECK(c.sinks.size() == 2);  // sink keys are the registry's: colour is found by prepare_sinks
  CHECK(outbox::config::with_line(yaml, "sinks[1].colour: unknown key") == "line 8: sinks[1].colour: unknown key");
  CHECK(outbox::config::with_line(yaml, "sinks[1].path: required") == "line 6: sinks[1].path: required");
  CHECK(outbox::config::with_line(yaml, "--table: bad") == "--table: bad");
  CHECK_THROWS_AS(parse_config(yaml, env_of({})), ConfigError);  // without a list: the first error throws
}

TEST_CASE("tracing: off by default; every key read, checked and described with the headers masked") {
  const std::string base = "database: {url: postgresql://h/app}\nsinks:\n  - {name: a, type: file, path: /tmp/a}\n";
  const auto off = parse_config(base, env_of());
  CHECK_FALSE(off.tracing.enabled());
  CHECK(off.tracing.queue_size == 8192);
  CHECK(off.tracing.batch_size == 512);
  CHECK(off.tracing.timeout == milliseconds{2'000});
  CHECK(off.tracing.export_interval == milliseconds{1'000});
  CHECK(off.tracing.service_name == "outbox-relay");
  CHECK_FALSE(off.tracing.root_spans);
  CHECK(describe(off)["tracing"]["otlp_endpoint"] == "off");

  const auto on = parse_config(base + R"(
tracing:
  otlp_endpoint: https://otel.example.com:4318
  headers: { Authorization: "Bearer ${TOKEN}" }
  timeout: 500ms
  queue_size: 1000
  batch_size: 100
  export_interval: 250ms
  service_name: orders-relay
  root_spans: true
)",
                               env_of({{"TOKEN", "sekret-token"}}));
  CHECK(on.tracing.enabled());
  CHECK(on.tracing.otlp_endpoint == "https://otel.example.com:4318");
  CHECK(on.tracing.headers.at("Authorization") == "Bearer sekret-token");
  CHECK(on.tracing.timeout == milliseconds{500});
  CHECK(on.tracing.queue_size == 1000);
  CHECK(on.tracing.batch_size == 100);
  CHECK(on.tracing.export_interval == milliseconds{250});
  CHECK(on.tracing.service_name == "orders-relay");
  CHECK(on.tracing.root_spans);
  const std::string text = describe(on).dump();
  CHECK(text.find("sekret-token") == std::string::npos);
  CHECK(describe(on)["tracing"]["headers"]["Authorization"] == "*****");
}

TEST_CASE("tracing: bad values name their key") {
  const std::string base = "database: {url: postgresql://h/app}\nsinks:\n  - {name: a, type: file, path: /tmp/a}\n";
  const auto err = [&](const std::string& tracing) { return error_of(base + "tracing:\n" + tracing); };
  CHECK(err("  otlp_endpoint: grpc://c:4317\n").rfind("tracing.otlp_endpoint: expected an http:// or https://", 0) ==
        0);
  CHECK(err("  otlp_endpoint: http://user:pw@c:4318\n").rfind("tracing.otlp_endpoint:", 0) == 0);
  CHECK(err("  headers: {\"bad name\": x}\n").rfind("tracing.headers.bad name:", 0) == 0);
  CHECK(err("  headers: {Content-Type: text/plain}\n").rfind("tracing.headers.Content-Type:", 0) == 0);
  CHECK(err("  timeout: 0ms\n").rfind("tracing.timeout:", 0) == 0);
  CHECK(err("  queue_size: 0\n").rfind("tracing.queue_size:", 0) == 0);
  CHECK(err("  queue_size: 10\n  batch_size: 11\n").rfind("tracing.batch_size: must not be larger", 0) == 0);
  CHECK(err("  export_interval: 2h\n").rfind("tracing.export_interval:", 0) == 0);
  CHECK(err("  service_name: ''\n").rfind("tracing.service_name:", 0) == 0);
  CHECK(err("  root_spans: maybe\n").rfind("tracing.root_spans:", 0) == 0);
  CHECK(err("  sampler: always\n").find("tracing.sampler") != std::string::npos);
}
