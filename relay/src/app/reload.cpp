#include "app/reload.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>
#include <utility>

#include "app/options.hpp"
#include "app/run.hpp"
#include "log/log.hpp"

namespace outbox::app {
namespace {

bool contains(const std::vector<std::string>& names, const std::string& name) {
  return std::find(names.begin(), names.end(), name) != names.end();
}

}  // namespace

Router make_router(const config::Config& config) {
  std::vector<Route> routes;
  for (const auto& r : config.routes) {
    Route route{r.topics, {}};
    for (const auto& name : r.sinks) {
      for (std::size_t i = 0; i < config.sinks.size(); ++i) {
        if (config.sinks[i].name == name) route.sinks.push_back(i);
      }
    }
    routes.push_back(std::move(route));
  }
  return Router(std::move(routes), config.sinks.size());
}

SinkGeneration first_generation(config::Config config, const std::vector<sinks::PreparedSink>& prepared) {
  SinkGeneration g;
  for (const auto& s : prepared) {
    g.owned.push_back(s.spec->make(s.name));
    g.sinks.push_back(g.owned.back().get());
  }
  g.router = std::make_unique<Router>(make_router(config));
  g.config = std::move(config);
  return g;
}

Reloader::Reloader(ConfigSource source, SinkGeneration first, Runner& runner, Bell& bell, Ops& ops)
    : source_(std::move(source)), current_(std::move(first)), runner_(runner), bell_(bell), ops_(ops) {}

void Reloader::refuse(const std::string& text, const std::vector<std::string>& errors) {
  for (const auto& e : errors) {
    log::error("config reload refused, nothing changed",
               {{"error", log::redact(config::with_line(text, e))}, {"config", source_.path}});
  }
  ops_.config_reloaded(false);
}

std::optional<SinkGeneration> Reloader::read_next(config::ConfigDiff& diff) {
  std::vector<std::string> errors;
  if (source_.path.empty()) {
    refuse("", {"--config: the relay was started without a config file; there is nothing to re-read"});
    return std::nullopt;
  }
  std::ifstream in(source_.path);
  std::stringstream buf;
  buf << in.rdbuf();
  const std::string text = buf.str();
  if (!in) errors.push_back("--config: cannot read " + source_.path);
  config::Config read;
  if (errors.empty()) {
    // As main.cpp reads it for `run` and `config check`: every error of the file, the options winning.
    try {
      read = config::parse_config(text, config::process_env(), source_.database_url, &errors);
      if (!source_.table.empty()) read.database.table = config::table_option(source_.table);
    } catch (const config::ConfigError& e) {
      errors.emplace_back(e.what());
    }
    if (!source_.log_level.empty()) read.log_level = source_.log_level;
    if (read.sinks.empty() && errors.empty()) errors.emplace_back("sinks: expected at least one sink");
  }
  // The sinks are read even after an error elsewhere, so that one reload names every error.
  const bool read_ok = errors.empty();
  config::Config next = config::keep_restart_keys(current_.config, read);
  std::vector<sinks::PreparedSink> prepared = prepare_sinks(next, &errors);
  // Both: the diff then names relay.batch_size when a sink's preference moves it.
  apply_sink_defaults(next, prepared);
  apply_sink_defaults(read, prepared);
  if (read_ok) diff = config::diff_configs(current_.config, read);
  if (!errors.empty()) {
    refuse(text, errors);
    return std::nullopt;
  }

  SinkGeneration g;
  for (std::size_t i = 0; i < prepared.size(); ++i) {
    const auto& s = prepared[i];
    if (contains(diff.kept, s.name)) {
      const auto old = std::find_if(current_.owned.begin(), current_.owned.end(),
                                    [&](const auto& sink) { return sink->name() == s.name; });
      g.owned.push_back(*old);
    } else {
      try {
        g.owned.push_back(s.spec->make(s.name));
      } catch (const std::exception& e) {  // the new sinks built so far go with g
        refuse(text, {next.sinks[i].path + ": " + e.what()});
        return std::nullopt;
      }
    }
    g.sinks.push_back(g.owned.back().get());
  }
  if (lane_groups_of(g.sinks) != lane_groups_of(current_.sinks)) {
    // The store divides the lanes among relays as the sinks started with needed (exactly_once);
    // a reload cannot change that under relays that share the table.
    refuse(text, {"sinks: exactly_once changes how relays divide the lanes among themselves; a restart is needed "
                  "to turn it on or off"});
    return std::nullopt;
  }
  if (progress_locations_of(g.sinks) != progress_locations_of(current_.sinks)) {
    // A new transactional id neither fences the old one's producers nor reads its mark: what the
    // old one committed but the table has not marked would go out again (docs/sinks.md).
    refuse(text, {"sinks: an exactly_once sink's transactional_id, progress_topic or name (which names both by "
                  "default) cannot change by a reload: stop every relay of the table with SIGTERM, then start them "
                  "with the new config"});
    return std::nullopt;
  }
  g.router = std::make_unique<Router>(make_router(next));
  g.config = std::move(next);
  return g;
}

void Reloader::request() {
  if (next_) {
    again_ = true;
    return;
  }
  log::info("reloading the config", {{"config", source_.path}});
  config::ConfigDiff diff;
  auto next = read_next(diff);
  if (!next) return;
  for (const auto& key : diff.restart_keys) {
    log::warn("config reload: a restart is needed to change this key; the relay keeps running on its old value",
              {{"key", key}});
  }
  runner_.post(
      Reconfiguration{next->sinks, next->router.get(), loop_options(next->config), runner_options(next->config)});
  bell_.ring(WakeSource::kReload);  // an idle loop takes it now
  next_ = std::move(next);
  next_diff_ = std::move(diff);
}

bool Reloader::poll() {
  if (!next_) return false;
  if (runner_.reconfiguration_pending()) return true;
  // The loop runs on next_ now and no longer uses any sink of current_ that next_ does not hold.
  ops_.set_sinks(next_->sinks);
  const auto timeout = current_.config.relay.shutdown_timeout;
  for (const auto& sink : current_.owned) {
    if (contains(next_diff_.removed, sink->name()) || contains(next_diff_.rebuilt, sink->name())) {
      sink->flush(timeout);
    }
  }
  const auto& d = next_diff_;
  log::info("config reloaded", {{"sinks_added", d.added},
                                {"sinks_removed", d.removed},
                                {"sinks_rebuilt", d.rebuilt},
                                {"sinks_kept", d.kept},
                                {"changed", d.changed},
                                {"restart_needed", d.restart_keys},
                                {"batch_size", next_->config.relay.batch_size},
                                {"log_level", next_->config.log_level}});
  // After that line, which the level in effect when the reload was asked for judges.
  log::Level level{};
  if (log::parse_level(next_->config.log_level, level)) log::set_level(level);
  ops_.config_reloaded(true);
  current_ = std::move(*next_);  // drops the removed and replaced sinks
  next_.reset();
  if (std::exchange(again_, false)) request();
  return waiting();
}

}  // namespace outbox::app
