// Parsing and describing `type: rabbitmq` sink entries.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "app/run.hpp"
#include "config/config.hpp"
#include "log/log.hpp"
#include "sinks/rabbitmq/rabbitmq_config.hpp"
#include "sinks/rabbitmq/rabbitmq_sink.hpp"
#include "sinks/registry.hpp"
#include "support/env.hpp"
#include "support/sinks.hpp"

using namespace outbox;
using config::ConfigError;

namespace {

using outbox::testing::env_of;

const outbox::testing::OneSink<sinks::RabbitmqSinkConfig> entry{"r", "rabbitmq", sinks::parse_rabbitmq_sink};

}  // namespace

TEST_CASE("rabbitmq config: defaults and every key") {
  const auto d = entry.settings("    url: 'amqp://broker'\n    exchange: outbox\n");
  CHECK(d.host == "broker");
  CHECK(d.port == 5672);
  CHECK(d.vhost == "/");
  CHECK(d.user == "guest");
  CHECK(d.password == "guest");
  CHECK(d.exchange == "outbox");
  CHECK(d.routing_key == "{topic}");
  CHECK(d.timeout == std::chrono::seconds{5});
  CHECK(d.max_in_flight == 1000);
  CHECK(d.recovery_grace == std::chrono::seconds{30});
  CHECK(d.key_order == sinks::RabbitmqKeyOrder::kConfirm);
  CHECK(d.key_path == "sinks[0]");
  CHECK(d.url_for_logs == "amqp://broker");

  const auto f = entry.settings(
      "    url: 'amqp://relay:${RMQ_PW}@127.0.0.1:5673/orders%2Fprod'\n"
      "    exchange: 'events.{topic}'\n"
      "    routing_key: '{topic}.{key}'\n"
      "    timeout: 2s\n"
      "    max_in_flight: 64\n"
      "    recovery_grace: 0s\n"
      "    key_order: channel\n",
      env_of({{"RMQ_PW", "p%40ss-word-1"}}));
  CHECK(f.host == "127.0.0.1");
  CHECK(f.port == 5673);
  CHECK(f.vhost == "orders/prod");
  CHECK(f.user == "relay");
  CHECK(f.password == "p@ss-word-1");  // percent-decoded, as the broker expects it
  CHECK(f.exchange == "events.{topic}");
  CHECK(f.routing_key == "{topic}.{key}");
  CHECK(f.timeout == std::chrono::seconds{2});
  CHECK(f.max_in_flight == 64);
  CHECK(f.recovery_grace == std::chrono::milliseconds{0});
  CHECK(f.key_order == sinks::RabbitmqKeyOrder::kChannel);
  CHECK(f.url_for_logs == "amqp://relay:*****@127.0.0.1:5673/orders%2Fprod");

  // "" is the default exchange: routing key = queue name.
  CHECK(entry.settings("    url: 'amqp://h'\n    exchange: ''\n").exchange.empty());
}

TEST_CASE("rabbitmq config: amqps:// is TLS, verified unless insecure_skip_verify") {
  const auto plain = entry.settings("    url: 'amqp://broker'\n    exchange: outbox\n");
  CHECK_FALSE(plain.tls);
  CHECK_FALSE(
      outbox::testing::describe_with_sinks(entry.config("    url: 'amqp://broker'\n    exchange: x\n"))["sinks"][0]
          .contains("tls"));
  const auto d = entry.settings("    url: 'amqps://relay:pw-tls-1@broker/'\n    exchange: outbox\n");
  CHECK(d.tls);
  CHECK(d.port == 5671);               // the AMQPS port
  CHECK(d.tls_files.ca_file.empty());  // the system CA store
  CHECK_FALSE(d.tls_files.insecure_skip_verify);
  const auto j = outbox::testing::describe_with_sinks(entry.config(
      "    url: 'amqps://broker:5673/'\n    exchange: x\n    tls: {insecure_skip_verify: true}\n"))["sinks"][0];
  CHECK(j["url"] == "amqps://broker:5673/");
  CHECK(j["tls"]["insecure_skip_verify"] == true);
  CHECK(j["tls"]["ca_file"] == "");
}

TEST_CASE("rabbitmq config: the password is masked in describe() and in every log line") {
  const auto c = entry.config("    url: 'amqp://relay:s3cr3t-rabbit-pw@mq:5672/'\n    exchange: outbox\n");
  const auto all = outbox::testing::describe_with_sinks(c);
  CHECK(all.dump().find("s3cr3t-rabbit-pw") == std::string::npos);
  const auto j = all["sinks"][0];
  CHECK(j["type"] == "rabbitmq");
  CHECK(j["url"] == "amqp://relay:*****@mq:5672/");
  CHECK(j["exchange"] == "outbox");
  CHECK(j["routing_key"] == "{topic}");
  CHECK(j["timeout"] == "5s");
  CHECK(j["max_in_flight"] == 1000);
  CHECK(j["recovery_grace"] == "30s");
  CHECK(log::redact("login as relay:s3cr3t-rabbit-pw refused") == "login as relay:***** refused");

  // A URL without a password, and one whose password holds '@' and ':' (percent-encoded).
  CHECK(entry.settings("    url: 'amqp://relay@mq/'\n    exchange: x\n").url_for_logs == "amqp://relay@mq/");
  const auto odd = entry.settings("    url: 'amqp://u:a%3Ab%40c-secret@mq/'\n    exchange: x\n");
  CHECK(odd.password == "a:b@c-secret");
  CHECK(odd.url_for_logs == "amqp://u:*****@mq/");
  CHECK(log::redact("a:b@c-secret and a%3Ab%40c-secret") == "***** and *****");
}

TEST_CASE("rabbitmq config: errors name the key and what was expected") {
  CHECK(entry.error_of("    exchange: x\n") == "sinks[0].url: required, but missing");
  CHECK(entry.error_of("    url: 'http://h'\n    exchange: x\n").find("sinks[0].url: expected amqp://") == 0);
  CHECK(entry.error_of("    url: 'amqp://h:notaport'\n    exchange: x\n").find("sinks[0].url: expected amqp://") == 0);
  CHECK(entry.error_of("    url: 'amqp://h'\n    exchange: x\n    tls: {insecure_skip_verify: true}\n") ==
        "sinks[0].tls: TLS settings apply to amqps:// urls only");
  CHECK(entry.error_of("    url: 'amqps://h'\n    exchange: x\n    tls: {ca_file: /nonexistent/ca.pem}\n") ==
        "sinks[0].tls.ca_file: cannot read /nonexistent/ca.pem");
  CHECK(entry.error_of("    url: 'amqp://h'\n").find("sinks[0].exchange: required, but missing") == 0);
  CHECK(entry.error_of("    url: 'amqp://h'\n    exchange: 'a b'\n").find("sinks[0].exchange: unexpected ' '") == 0);
  CHECK(entry.error_of("    url: 'amqp://h'\n    exchange: 'x.{key}'\n").find("sinks[0].exchange: unexpected '{'") ==
        0);
  CHECK(entry.error_of("    url: 'amqp://h'\n    exchange: '" + std::string(256, 'a') + "'\n") ==
        "sinks[0].exchange: longer than 255 bytes");
  CHECK(entry.error_of("    url: 'amqp://h'\n    exchange: x\n    routing_key: '{name}'\n")
            .find("sinks[0].routing_key: unexpected '{'") == 0);
  CHECK(entry.error_of("    url: 'amqp://h'\n    exchange: x\n    routing_key: 'a}'\n")
            .find("sinks[0].routing_key: unexpected '}'") == 0);
  CHECK(entry.error_of("    url: 'amqp://h'\n    exchange: x\n    timeout: 10ms\n") ==
        "sinks[0].timeout: expected 100ms to 10m, got 10ms");
  CHECK(
      entry.error_of("    url: 'amqp://h'\n    exchange: x\n    max_in_flight: 0\n").find("sinks[0].max_in_flight:") ==
      0);
  CHECK(entry.error_of("    url: 'amqp://h'\n    exchange: x\n    max_in_flight: 70000\n")
            .find("sinks[0].max_in_flight:") == 0);
  CHECK(entry.error_of("    url: 'amqp://h'\n    exchange: x\n    recovery_grace: 2h\n") ==
        "sinks[0].recovery_grace: expected 0s to 1h, got 2h");
  CHECK(entry.error_of("    url: 'amqp://h'\n    exchange: x\n    recovery_grace: soon\n")
            .find("sinks[0].recovery_grace:") == 0);
  CHECK(entry.error_of("    url: 'amqp://h'\n    exchange: x\n    key_order: strict\n").find("sinks[0].key_order:") ==
        0);
  CHECK(
      entry.error_of("    url: 'amqp://h'\n    exchange: x\n    exchang: y\n").find("sinks[0].exchang: unknown key") ==
      0);
  // The URL (it may carry a password) never appears in an error.
  CHECK(entry.error_of("    url: 'amqp://u:hidden-pw-9@h:bad'\n    exchange: x\n").find("hidden-pw-9") ==
        std::string::npos);
}

TEST_CASE("rabbitmq config: templates") {
  CHECK_FALSE(sinks::check_exchange_template(""));
  CHECK_FALSE(sinks::check_exchange_template("outbox"));
  CHECK_FALSE(sinks::check_exchange_template("events.{topic}:v1"));
  CHECK(sinks::check_exchange_template("{topic"));
  CHECK(sinks::check_exchange_template("a/b"));
  CHECK_FALSE(sinks::check_routing_key_template(""));
  CHECK_FALSE(sinks::check_routing_key_template("{topic}.{key}"));
  CHECK_FALSE(sinks::check_routing_key_template("orders.*/#"));
  CHECK(sinks::check_routing_key_template("{topic}{"));
  CHECK(sinks::render_rabbitmq_template("events.{topic}", "order.paid", "k1") == "events.order.paid");
  CHECK(sinks::render_rabbitmq_template("{topic}.{key}.{topic}", "t", "k") == "t.k.t");
  CHECK(sinks::render_rabbitmq_template("fixed", "t", "k") == "fixed");
  CHECK(sinks::render_rabbitmq_template("", "t", "k") == "");
}

TEST_CASE("rabbitmq config: the registry builds the sink; an unreachable broker is not an error") {
  log::set_level(log::Level::kError);  // the sink warns that nothing listens on port 1
  const auto c = entry.config("    url: 'amqp://127.0.0.1:1'\n    exchange: x\n    timeout: 200ms\n");
  const auto prepared = app::prepare_sinks(c);
  REQUIRE(prepared.size() == 1);
  CHECK(prepared[0].type == "rabbitmq");
  auto sink = prepared[0].spec->make("r");
  CHECK(sink->name() == "r");
  CHECK_FALSE(sink->usable());

  // With no broker, every event of a batch is a retry naming the cause; none is delivered.
  Event a, b;
  a.id = 1;
  a.topic = b.topic = "t";
  a.key = b.key = "k";
  a.payload = b.payload = "{}";
  b.id = 2;
  const Event* batch[] = {&a, &b};
  const auto outcomes = sink->publish(batch);
  REQUIRE(outcomes.size() == 2);
  CHECK(outcomes[0].kind == OutcomeKind::kRetry);
  CHECK(outcomes[0].reason.find("not connected: cannot connect to 127.0.0.1:1") == 0);
  CHECK(outcomes[1].kind == OutcomeKind::kRetry);
  log::set_level(log::Level::kInfo);
}
