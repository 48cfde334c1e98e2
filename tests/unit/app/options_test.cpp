// The option structs built from the config (app/options.hpp): every default comes from
// config/config.hpp, and each setting reaches the struct that uses it.
#include <doctest/doctest.h>

#include "app/options.hpp"
#include "app/run.hpp"
#include "support/env.hpp"

using namespace outbox;
using std::chrono::milliseconds;

TEST_CASE("options: a config's defaults reach the loop, the runner, the store and the listener") {
  const config::Config c;
  const LoopOptions loop = app::loop_options(c);
  CHECK(loop.batch_size == 500);
  CHECK(loop.in_flight_bytes == 64ULL << 20);
  CHECK(loop.max_attempts == 20);
  CHECK(loop.backoff.initial == milliseconds(1'000));
  CHECK(loop.backoff.max == milliseconds(300'000));
  CHECK(loop.outcome_delay == milliseconds(50));

  const RunnerOptions runner = app::runner_options(c);
  CHECK(runner.sweep_interval == milliseconds(30'000));
  CHECK(runner.rebalance_interval == milliseconds(5'000));
  CHECK(runner.poll_interval == milliseconds(5));
  CHECK(runner.light_poll_interval == milliseconds(8));
  CHECK(runner.idle_poll_interval == milliseconds(100));
  CHECK(runner.idle_after == milliseconds(2'000));
  CHECK(runner.watched_poll_interval == milliseconds(1'000));
  CHECK(runner.reconnect.initial == milliseconds(500));
  CHECK(runner.reconnect.max == milliseconds(30'000));

  Health health;
  const pg::PgStoreOptions store = app::store_options(c, "relay-1", &health);
  CHECK(store.url.empty());
  CHECK(store.table == "outbox_events");
  CHECK(store.instance_id == "relay-1");
  CHECK(store.lease == milliseconds(60'000));
  CHECK_FALSE(store.delete_on_success);
  CHECK(store.writer_hold_warning == milliseconds(5'000));
  CHECK(store.health == &health);

  const pg::WatchOptions watch = app::watch_options(c);
  CHECK(watch.enabled);
  CHECK(watch.table == "outbox_events");
  CHECK(watch.check == milliseconds(100));     // relay.idle_poll_interval
  CHECK(watch.length == milliseconds(1'000));  // the watched relay's poll interval
}

TEST_CASE("options: the file's settings reach the structs") {
  const auto c = config::parse_config(
      "database: {url: 'postgresql://u@h/db', table: app.events, reconnect: {initial: 1s, max: 10s}}\n"
      "relay: {batch_size: 50, max_attempts: 3, backoff: {initial: 2s, max: 1m}, lease: 30s, on_success: delete,\n"
      "        sweep_interval: 10s, rebalance_interval: 2s, poll_interval: 10ms, light_poll_interval: 20ms,\n"
      "        idle_poll_interval: 250ms, idle_watch: false, writer_hold_warning: 1s, in_flight_bytes: 2097152}\n",
      outbox::testing::env_of());
  const LoopOptions loop = app::loop_options(c);
  CHECK(loop.batch_size == 50);
  CHECK(loop.in_flight_bytes == 2'097'152);
  CHECK(loop.max_attempts == 3);
  CHECK(loop.backoff.initial == milliseconds(2'000));
  CHECK(loop.backoff.max == milliseconds(60'000));

  const RunnerOptions runner = app::runner_options(c);
  CHECK(runner.sweep_interval == milliseconds(10'000));
  CHECK(runner.rebalance_interval == milliseconds(2'000));
  CHECK(runner.poll_interval == milliseconds(10));
  CHECK(runner.light_poll_interval == milliseconds(20));
  CHECK(runner.idle_poll_interval == milliseconds(250));
  CHECK(runner.reconnect.initial == milliseconds(1'000));
  CHECK(runner.reconnect.max == milliseconds(10'000));

  const pg::PgStoreOptions store = app::store_options(c, "relay-2", nullptr);
  CHECK(store.url == "postgresql://u@h/db");
  CHECK(store.table == "app.events");
  CHECK(store.lease == milliseconds(30'000));
  CHECK(store.delete_on_success);
  CHECK(store.writer_hold_warning == milliseconds(1'000));
  CHECK(store.health == nullptr);

  const pg::WatchOptions watch = app::watch_options(c);
  CHECK_FALSE(watch.enabled);
  CHECK(watch.table == "app.events");
  CHECK(watch.check == milliseconds(250));
  CHECK(watch.notify_every == milliseconds(250));  // a NOTIFY wakes it at most as often as it polls idle
}

TEST_CASE("options: relay.batch_size left out takes what an exactly-once Kafka sink asks for") {
  const auto batch_size = [](const std::string& relay, const std::string& kafka) {
    auto c = config::parse_config("database: {url: 'postgresql://u@h/db'}\n" + relay +
                                      "sinks:\n"
                                      "  - {name: k, type: kafka, brokers: 'b:9092', topic: t" +
                                      kafka +
                                      "}\n"
                                      "  - {name: f, type: file, path: /tmp/x}\n",
                                  outbox::testing::env_of());
    app::apply_sink_defaults(c, app::prepare_sinks(c));
    return app::loop_options(c).batch_size;
  };
  CHECK(batch_size("", "") == 500);
  CHECK(batch_size("", ", exactly_once: true") == 2000);
  CHECK(batch_size("relay: {batch_size: 300}\n", ", exactly_once: true") == 300);  // the file's value stands
  CHECK(batch_size("relay: {batch_size: 500}\n", ", exactly_once: true") == 500);
  CHECK(batch_size("relay: {batch_size: 5000}\n", "") == 5000);
}

TEST_CASE("options: relay.in_flight_bytes below 1 MiB is refused, naming the key") {
  const auto error = outbox::testing::config_error_of([] {
    config::parse_config("database: {url: 'postgresql://u@h/db'}\nrelay: {in_flight_bytes: 1000}\n",
                         outbox::testing::env_of());
  });
  CHECK(error.find("relay.in_flight_bytes") != std::string::npos);
}
