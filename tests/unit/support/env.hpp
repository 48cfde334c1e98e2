#pragma once
// Test support for config parsing: an environment that is a plain map, not the process's, and the
// error a parse throws.
#include <map>
#include <optional>
#include <string>
#include <utility>

#include "config/section.hpp"

namespace outbox::testing {

inline config::EnvLookup env_of(std::map<std::string, std::string> vars = {}) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

// The message of the ConfigError that parse() throws, or `none` if it throws nothing.
template <class Parse>
std::string config_error_of(Parse&& parse, std::string none = "(no error)") {
  try {
    std::forward<Parse>(parse)();
  } catch (const config::ConfigError& e) {
    return e.what();
  }
  return none;
}

}  // namespace outbox::testing
