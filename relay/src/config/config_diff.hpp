#pragma once
// What a reload of the config file changes (SIGHUP, `outbox-relay reload`): a pure comparison of
// the running config and the file's new one. app/reload.cpp carries the plan out.
#include <string>
#include <vector>

#include "config/config.hpp"

namespace outbox::config {

struct ConfigDiff {
  // Keys that changed but need new sessions or sockets (database.*, http.*, relay.instance_id,
  // ...): the relay keeps running on their old values and warns that a restart is needed.
  std::vector<std::string> restart_keys;
  // Reloadable keys that changed ("relay.batch_size", "log.level", "routes", ...), sinks aside.
  std::vector<std::string> changed;
  // Sinks by name: kept (an equal SinkConfig::fingerprint: its Sink object stays), rebuilt (the entry changed),
  // added and removed, each in the order of its config.
  std::vector<std::string> kept;
  std::vector<std::string> rebuilt;
  std::vector<std::string> added;
  std::vector<std::string> removed;

  bool changes_nothing() const { return changed.empty() && rebuilt.empty() && added.empty() && removed.empty(); }
};

ConfigDiff diff_configs(const Config& before, const Config& after);

// `after` with the values of `before` for every key that needs a restart (ConfigDiff::restart_keys):
// what the relay runs on after the reload.
Config keep_restart_keys(const Config& before, Config after);

}  // namespace outbox::config
