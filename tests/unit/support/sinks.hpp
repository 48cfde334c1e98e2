#pragma once
// Test support: a config read as `outbox-relay run` reads it (config/, then the sink registry),
// the typed settings of one sink entry, and a config of one sink entry for a sink folder's tests.
#include <cstddef>
#include <string>

#include "app/run.hpp"
#include "config/config.hpp"
#include "sinks/registry.hpp"
#include "support/env.hpp"

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

// A config whose one sink entry is `- name: <name>, type: <type>` and the lines a test gives
// (indented four spaces), read by its folder's parser. `tail` follows the entry (e.g. routes).
template <class Settings>
class OneSink {
 public:
  using Parse = Settings (*)(config::Section&);

  OneSink(std::string name, std::string type, Parse parse, std::string tail = {})
      : head_("database: {url: 'postgresql://u@h/db'}\nsinks:\n  - name: " + std::move(name) +
              "\n    type: " + std::move(type) + "\n"),
        tail_(std::move(tail)),
        parse_(parse) {}

  config::Config config(const std::string& body, const config::EnvLookup& env = env_of()) const {
    return parse_with_sinks(head_ + body + tail_, env);
  }
  Settings settings(const std::string& body, const config::EnvLookup& env = env_of()) const {
    return sink_settings(config(body, env), 0, parse_);
  }
  std::string error_of(const std::string& body, const config::EnvLookup& env = env_of()) const {
    return config_error_of([&] { config(body, env); });
  }

 private:
  std::string head_;
  std::string tail_;
  Parse parse_;
};

}  // namespace outbox::testing
