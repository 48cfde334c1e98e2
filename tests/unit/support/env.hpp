#pragma once
// Test support: an environment for config parsing that is a plain map, not the process's.
#include <map>
#include <optional>
#include <string>

#include "config/section.hpp"

namespace outbox::testing {

inline config::EnvLookup env_of(std::map<std::string, std::string> vars = {}) {
  return [vars = std::move(vars)](const std::string& name) -> std::optional<std::string> {
    auto it = vars.find(name);
    if (it == vars.end()) return std::nullopt;
    return it->second;
  };
}

}  // namespace outbox::testing
