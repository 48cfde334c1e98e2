// Parsing and describing `type: nats` sink entries.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "app/run.hpp"
#include "config/config.hpp"
#include "log/log.hpp"
#include "sinks/nats/nats_config.hpp"
#include "sinks/nats/nats_sink.hpp"
#include "sinks/registry.hpp"
#include "support/env.hpp"
#include "support/sinks.hpp"

using namespace outbox;
using config::ConfigError;

namespace {

using outbox::testing::env_of;

const outbox::testing::OneSink<sinks::NatsSinkConfig> entry{"n", "nats", sinks::parse_nats_sink};

}  // namespace

TEST_CASE("nats config: defaults and every key") {
  const auto c = entry.config("    url: 'nats://127.0.0.1:4222'\n");
  const auto n = outbox::testing::sink_settings(c, 0, sinks::parse_nats_sink);
  CHECK(n.url == "nats://127.0.0.1:4222");
  CHECK(n.url_for_logs == "nats://127.0.0.1:4222");
  CHECK(n.subject == "{topic}");
  CHECK(n.timeout == std::chrono::seconds{5});
  CHECK(n.max_in_flight == 1024);
  CHECK(n.no_stream == sinks::NatsNoStream::kRetry);
  CHECK(n.key_path == "sinks[0]");

  const auto full = entry.config(
      "    url: ${NATS_URL}\n"
      "    subject: 'outbox.{topic}.v1'\n"
      "    timeout: 2s\n"
      "    max_in_flight: 64\n"
      "    no_stream: permanent\n",
      env_of({{"NATS_URL", "nats://a:4222, tls://b:4223"}}));
  const auto f = outbox::testing::sink_settings(full, 0, sinks::parse_nats_sink);
  CHECK(f.url == "nats://a:4222, tls://b:4223");
  CHECK(f.url_for_logs == "nats://a:4222,tls://b:4223");
  CHECK(f.subject == "outbox.{topic}.v1");
  CHECK(f.timeout == std::chrono::seconds{2});
  CHECK(f.max_in_flight == 64);
  CHECK(f.no_stream == sinks::NatsNoStream::kPermanent);
}

TEST_CASE("nats config: errors name the key and what was expected") {
  CHECK(entry.error_of("    subject: x\n") == "sinks[0].url: required, but missing");
  CHECK(entry.error_of("    url: 'http://h:4222'\n") ==
        "sinks[0].url: unsupported scheme 'http', expected one of: nats, tls");
  CHECK(entry.error_of("    url: 'h:4222'\n").find("sinks[0].url: expected nats://") == 0);
  CHECK(entry.error_of("    url: 'nats://a:1,,nats://b:2'\n").find("sinks[0].url: empty URL in the list") == 0);
  CHECK(entry.error_of("    url: 'nats://a b:1'\n").find("sinks[0].url: expected nats://") == 0);
  CHECK(entry.error_of("    url: 'nats://h:99999'\n") == "sinks[0].url: port 99999 out of range 1..65535");
  CHECK(entry.error_of("    url: 'nats://h:1'\n    subject: 'events.{name}'\n")
            .find("sinks[0].subject: unexpected '{'") == 0);
  CHECK(entry.error_of("    url: 'nats://h:1'\n    subject: 'events {topic}'\n")
            .find("sinks[0].subject: unexpected ' '") == 0);
  CHECK(entry.error_of("    url: 'nats://h:1'\n    subject: 'events.*'\n")
            .find("sinks[0].subject: 'events.*' does not") == 0);
  CHECK(entry.error_of("    url: 'nats://h:1'\n    subject: 'events.>'\n").find("sinks[0].subject:") == 0);
  CHECK(entry.error_of("    url: 'nats://h:1'\n    subject: 'a..{topic}'\n").find("sinks[0].subject:") == 0);
  CHECK(entry.error_of("    url: 'nats://h:1'\n    subject: '.{topic}'\n").find("sinks[0].subject:") == 0);
  CHECK(entry.error_of("    url: 'nats://h:1'\n    subject: ''\n").find("sinks[0].subject: must not be empty") == 0);
  CHECK(entry.error_of("    url: 'nats://h:1'\n    timeout: 10ms\n") ==
        "sinks[0].timeout: expected a duration from 100ms to 10m, got 10ms");
  CHECK(entry.error_of("    url: 'nats://h:1'\n    timeout: soon\n").find("sinks[0].timeout:") == 0);
  CHECK(entry.error_of("    url: 'nats://h:1'\n    max_in_flight: 0\n")
            .find("sinks[0].max_in_flight: expected a whole "
                  "number from 1 to 65536") == 0);
  CHECK(entry.error_of("    url: 'nats://h:1'\n    no_stream: ignore\n") ==
        "sinks[0].no_stream: unsupported value 'ignore', expected one of: retry, permanent");
  CHECK(entry.error_of("    url: 'nats://h:1'\n    stream: X\n").find("sinks[0].stream: unknown key") == 0);
}

TEST_CASE("nats config: passwords and tokens in the URL are masked in describe(), errors and every log line") {
  const auto c =
      entry.config("    url: 'nats://relay:n4ts-s3cret-pw@127.0.0.1:4222,nats://tok3n-abcdef@10.0.0.2:4222'\n");
  const auto j = outbox::testing::describe_with_sinks(c)["sinks"][0];
  CHECK(j["type"] == "nats");
  CHECK(j["url"] == "nats://relay:*****@127.0.0.1:4222,nats://*****@10.0.0.2:4222");
  CHECK(j["subject"] == "{topic}");
  CHECK(j["timeout"] == "5s");
  CHECK(j["max_in_flight"] == 1024);
  CHECK(j["no_stream"] == "retry");
  const std::string described = outbox::testing::describe_with_sinks(c).dump();
  CHECK(described.find("n4ts-s3cret-pw") == std::string::npos);
  CHECK(described.find("tok3n-abcdef") == std::string::npos);
  CHECK(log::redact("auth with n4ts-s3cret-pw and tok3n-abcdef failed") == "auth with ***** and ***** failed");

  // A URL that fails its check never echoes its password.
  const std::string error = entry.error_of("    url: 'nats://relay:an0ther-s3cret@host:4222/x y'\n");
  CHECK(error.find("sinks[0].url:") == 0);
  CHECK(error.find("an0ther-s3cret") == std::string::npos);
  CHECK(log::redact("an0ther-s3cret") == "*****");
}

TEST_CASE("nats config: subjects and headers") {
  CHECK_FALSE(sinks::check_subject_template("{topic}"));
  CHECK_FALSE(sinks::check_subject_template("outbox.{topic}"));
  CHECK_FALSE(sinks::check_subject_template("all-events"));
  CHECK_FALSE(sinks::check_subject_template("{topic}.{topic}"));
  CHECK(sinks::check_subject_template("{topic"));
  CHECK(sinks::check_subject_template("a b"));
  CHECK(sinks::check_subject_template("a.*.{topic}"));
  CHECK(sinks::check_subject_template("{topic}."));
  CHECK(sinks::render_subject("outbox.{topic}", "order.paid") == "outbox.order.paid");
  CHECK(sinks::render_subject("{topic}-{topic}", "x") == "x-x");
  CHECK(sinks::render_subject("fixed", "x") == "fixed");
  CHECK(sinks::valid_nats_subject("outbox.order_paid-1"));
  CHECK(sinks::valid_nats_subject("a.b*c.d>e"));  // wildcards only as whole tokens
  CHECK_FALSE(sinks::valid_nats_subject("order paid"));
  CHECK_FALSE(sinks::valid_nats_subject("order.*"));
  CHECK_FALSE(sinks::valid_nats_subject("order.>"));
  CHECK_FALSE(sinks::valid_nats_subject("order..paid"));
  CHECK_FALSE(sinks::valid_nats_subject(""));
  CHECK_FALSE(sinks::valid_nats_subject("order\tpaid"));

  CHECK(sinks::valid_nats_header_name("trace-id"));
  CHECK_FALSE(sinks::valid_nats_header_name("trace id"));
  CHECK_FALSE(sinks::valid_nats_header_name("trace:id"));
  CHECK_FALSE(sinks::valid_nats_header_name(""));
  CHECK(sinks::valid_nats_header_value("a value: with spaces"));
  CHECK_FALSE(sinks::valid_nats_header_value("two\r\nlines"));
  CHECK(sinks::is_reserved_nats_header("Nats-Msg-Id"));
  CHECK(sinks::is_reserved_nats_header("nats-expected-stream"));
  CHECK_FALSE(sinks::is_reserved_nats_header("natsy"));
  CHECK(sinks::is_reserved_nats_header("outbox-id"));
  CHECK(sinks::is_reserved_nats_header("Outbox-Topic"));
  CHECK(sinks::is_reserved_nats_header("ce-id"));
  CHECK_FALSE(sinks::is_reserved_nats_header("traceparent"));
}

TEST_CASE("nats config: the registry builds the sink; it connects in the background") {
  log::set_level(log::Level::kError);  // the sink warns that nothing listens on port 1
  const auto good = entry.config("    url: 'nats://127.0.0.1:1'\n    timeout: 200ms\n");
  auto sink = app::prepare_sinks(good).at(0).spec->make("n");
  CHECK(sink->name() == "n");
  CHECK_FALSE(sink->usable());  // nothing listens on port 1
  // Without a connection every event retries at once (no wait for the timeout).
  Event e;
  e.id = 7;
  e.topic = "t";
  e.key = "k";
  e.payload = "{}";
  const Event* batch[] = {&e};
  const auto outcomes = sink->publish(batch);
  REQUIRE(outcomes.size() == 1);
  CHECK(outcomes[0].kind == OutcomeKind::kRetry);
  CHECK(outcomes[0].reason == "not connected to NATS at nats://127.0.0.1:1");
  log::set_level(log::Level::kInfo);
}
