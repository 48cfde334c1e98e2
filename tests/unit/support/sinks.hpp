#pragma once
// Test support: a config read as `outbox-relay run` reads it (config/, then the sink registry),
// and the typed settings of one sink entry.
#include <cstddef>
#include <string>

#include "app/run.hpp"
#include "config/config.hpp"
#include "sinks/registry.hpp"

namespace outbox::testing {

// parse_config, then every sink entry through its type's row. Throws config::ConfigError.
inline config::Config parse_with_sinks(const std::string& yaml, const config::EnvLookup& env) {
  auto c = config::parse_config(yaml, env);
  app::prepare_sinks(c);
  return c;
}

// The settings of c.sinks[i], read by its folder's parser as the registry reads them.
template <class Settings>
Settings sink_settings(const config::Config& c, std::size_t i, Settings (*parse)(config::Section&)) {
  const auto& entry = c.sinks.at(i);
  config::Section section(entry.section, entry.path, entry.env);
  section.required_string("name");
  section.string_or("type", "");
  Settings settings = parse(section);
  section.finish();
  return settings;
}

// The start-up log's view of the whole config, sinks included.
inline nlohmann::json describe_with_sinks(const config::Config& c) {
  auto described = config::describe(c);
  described["sinks"] = sinks::describe(app::prepare_sinks(c));
  return described;
}

}  // namespace outbox::testing
