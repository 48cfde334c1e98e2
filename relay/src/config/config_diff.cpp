#include "config/config_diff.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

#include "config/duration.hpp"

namespace outbox::config {
namespace {

// The keys of the running config that only a restart changes, each with a reading of its value.
std::vector<std::pair<std::string, std::string>> restart_values(const Config& c) {
  const auto d = [](std::chrono::milliseconds v) { return format_duration(v); };
  return {
      {"database.url", c.database.url},
      {"database.table", c.database.table},
      {"database.channel", c.database.channel},
      {"database.reconnect.initial", d(c.database.reconnect.initial)},
      {"database.reconnect.max", d(c.database.reconnect.max)},
      {"http.enabled", c.http.enabled ? "true" : "false"},
      {"http.listen", c.http.listen},
      {"http.refresh_interval", d(c.http.refresh_interval)},
      {"relay.instance_id", c.relay.instance_id},
      {"relay.lease", d(c.relay.lease)},
      {"relay.on_success", c.relay.on_success == OnSuccess::kDelete ? "delete" : "mark"},
      {"relay.writer_hold_warning", d(c.relay.writer_hold_warning)},
      {"relay.idle_watch", c.relay.idle_watch ? "true" : "false"},
      {"relay.retention", c.relay.retention ? d(*c.relay.retention) : "off"},
      {"relay.retention_interval", d(c.relay.retention_interval)},
      // The exporter and its thread are made at start, and the loop holds it: a restart changes
      // it. The headers are compared by value (a rotated collector token needs the restart), and
      // only the key's name is ever logged.
      {"tracing.otlp_endpoint", c.tracing.otlp_endpoint},
      {"tracing.headers", nlohmann::json(c.tracing.headers).dump()},
      {"tracing.timeout", d(c.tracing.timeout)},
      {"tracing.queue_size", std::to_string(c.tracing.queue_size)},
      {"tracing.batch_size", std::to_string(c.tracing.batch_size)},
      {"tracing.export_interval", d(c.tracing.export_interval)},
      {"tracing.service_name", c.tracing.service_name},
      {"tracing.root_spans", c.tracing.root_spans ? "true" : "false"},
  };
}

std::vector<std::pair<std::string, std::string>> reloadable_values(const Config& c) {
  const auto d = [](std::chrono::milliseconds v) { return format_duration(v); };
  nlohmann::json routes = nlohmann::json::array();
  for (const auto& r : c.routes) routes.push_back({r.topics, r.sinks});
  return {
      {"relay.batch_size", std::to_string(c.relay.batch_size)},
      {"relay.in_flight_bytes", std::to_string(c.relay.in_flight_bytes)},
      {"relay.max_attempts", std::to_string(c.relay.max_attempts)},
      {"relay.backoff.initial", d(c.relay.backoff.initial)},
      {"relay.backoff.max", d(c.relay.backoff.max)},
      {"relay.sweep_interval", d(c.relay.sweep_interval)},
      {"relay.rebalance_interval", d(c.relay.rebalance_interval)},
      {"relay.poll_interval", d(c.relay.poll_interval)},
      {"relay.light_poll_interval", d(c.relay.light_poll_interval)},
      {"relay.light_poll_events", std::to_string(c.relay.light_poll_events)},
      {"relay.idle_poll_interval", d(c.relay.idle_poll_interval)},
      {"relay.shutdown_timeout", d(c.relay.shutdown_timeout)},
      {"log.level", c.log_level},
      {"routes", routes.dump()},
  };
}

const SinkConfig* find_sink(const Config& c, const std::string& name) {
  for (const auto& s : c.sinks) {
    if (s.name == name) return &s;
  }
  return nullptr;
}

}  // namespace

ConfigDiff diff_configs(const Config& before, const Config& after) {
  ConfigDiff diff;
  const auto compare = [](const auto& old_values, const auto& new_values, std::vector<std::string>& out) {
    for (std::size_t i = 0; i < old_values.size(); ++i) {
      if (old_values[i].second != new_values[i].second) out.push_back(old_values[i].first);
    }
  };
  compare(restart_values(before), restart_values(after), diff.restart_keys);
  compare(reloadable_values(before), reloadable_values(after), diff.changed);
  for (const auto& s : after.sinks) {
    const SinkConfig* old = find_sink(before, s.name);
    if (old == nullptr) {
      diff.added.push_back(s.name);
    } else if (old->fingerprint == s.fingerprint) {
      diff.kept.push_back(s.name);
    } else {
      diff.rebuilt.push_back(s.name);
    }
  }
  for (const auto& s : before.sinks) {
    if (find_sink(after, s.name) == nullptr) diff.removed.push_back(s.name);
  }
  return diff;
}

Config keep_restart_keys(const Config& before, Config after) {
  after.database = before.database;
  after.http = before.http;
  after.tracing = before.tracing;
  auto& r = after.relay;
  const auto& b = before.relay;
  r.instance_id = b.instance_id;
  r.lease = b.lease;
  r.on_success = b.on_success;
  r.writer_hold_warning = b.writer_hold_warning;
  r.idle_watch = b.idle_watch;
  r.retention = b.retention;
  r.retention_interval = b.retention_interval;
  return after;
}

}  // namespace outbox::config
