#include "app/options.hpp"

#include <utility>

#include "version.hpp"

namespace outbox::app {

LoopOptions loop_options(const config::Config& config) {
  const auto& r = config.relay;
  return LoopOptions{r.batch_size, r.max_attempts, r.backoff, r.outcome_delay, r.in_flight_bytes};
}

RunnerOptions runner_options(const config::Config& config) {
  const auto& r = config.relay;
  RunnerOptions o;
  o.sweep_interval = r.sweep_interval;
  o.rebalance_interval = r.rebalance_interval;
  o.poll_interval = r.poll_interval;
  o.light_poll_interval = r.light_poll_interval;
  o.light_poll_events = r.light_poll_events;
  o.idle_poll_interval = r.idle_poll_interval;
  o.idle_after = r.idle_after;
  o.watched_poll_interval = r.watched_poll_interval;
  o.reconnect = config.database.reconnect;
  return o;
}

pg::PgStoreOptions store_options(const config::Config& config, std::string instance_id, Health* health) {
  pg::PgStoreOptions o;
  o.url = config.database.url;
  o.table = config.database.table;
  o.instance_id = std::move(instance_id);
  o.lease = config.relay.lease;
  o.delete_on_success = config.relay.on_success == config::OnSuccess::kDelete;
  o.writer_hold_warning = config.relay.writer_hold_warning;
  o.health = health;
  return o;
}

pg::WatchOptions watch_options(const config::Config& config) {
  pg::WatchOptions o;
  o.enabled = config.relay.idle_watch;
  o.table = config.database.table;
  // The watch reads the sequence as often as an idle relay without it would poll, and lasts as
  // long as the polls of a watched relay are apart.
  o.check = config.relay.idle_poll_interval;
  o.length = config.relay.watched_poll_interval;
  // A NOTIFY wakes the relay at most as often as it polls when idle: a flood from any role costs
  // a drain per idle_poll_interval at most.
  o.notify_every = config.relay.idle_poll_interval;
  return o;
}

tracing::ExporterOptions exporter_options(const config::Config& config, const std::string& instance_id) {
  const config::TracingConfig& t = config.tracing;
  return {t.otlp_endpoint, t.headers,         t.timeout,    t.queue_size,
          t.batch_size,    t.export_interval, t.root_spans, {t.service_name, instance_id, kVersion}};
}

}  // namespace outbox::app
