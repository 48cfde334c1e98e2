#include "config/section.hpp"

#include <yaml-cpp/yaml.h>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "config/duration.hpp"

namespace outbox::config {
namespace {

std::string join(const std::vector<std::string>& items) {
  std::string out;
  for (const auto& item : items) out += (out.empty() ? "" : ", ") + item;
  return out;
}

}  // namespace

EnvLookup process_env() {
  return [](const std::string& name) -> std::optional<std::string> {
    const char* value = std::getenv(name.c_str());
    if (!value) return std::nullopt;
    return std::string(value);
  };
}

std::string interpolate(const std::string& text, const std::string& key, const EnvLookup& env) {
  std::string out;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t open = text.find("${", i);
    if (open == std::string::npos) {
      out.append(text, i);
      break;
    }
    out.append(text, i, open - i);
    const std::size_t close = text.find('}', open);
    if (close == std::string::npos) {
      throw ConfigError(key + ": unterminated ${ in value (expected ${NAME})");
    }
    const std::string expr = text.substr(open + 2, close - open - 2);
    if (expr.rfind("file:", 0) == 0) {
      const std::string file = expr.substr(5);
      std::ifstream in(file);
      if (!in) throw ConfigError(key + ": cannot read secret file " + file);
      std::stringstream buf;
      buf << in.rdbuf();
      std::string content = buf.str();
      while (!content.empty() && (content.back() == '\n' || content.back() == '\r')) content.pop_back();
      out += content;
    } else {
      const std::size_t dflt = expr.find(":-");
      const std::string name = expr.substr(0, dflt);
      if (name.empty()) throw ConfigError(key + ": empty ${} in value (expected ${NAME})");
      if (auto value = env(name)) {
        out += *value;
      } else if (dflt != std::string::npos) {
        out += expr.substr(dflt + 2);
      } else {
        throw ConfigError(key + ": environment variable " + name + " is not set (use ${" + name +
                          ":-default} for a default)");
      }
    }
    i = close + 1;
  }
  return out;
}

Section::Section(YamlNode node, std::string path, const EnvLookup& env)
    : node_(node ? std::move(node) : std::make_shared<YAML::Node>()), path_(std::move(path)), env_(env) {
  if (*node_ && !node_->IsNull() && !node_->IsMap()) {
    throw ConfigError((path_.empty() ? std::string("config") : path_) + ": expected a mapping of keys");
  }
}

std::string Section::key_path(const std::string& key) const { return path_.empty() ? key : path_ + "." + key; }

bool Section::has(const std::string& key) const {
  const YAML::Node& node = *node_;
  return node && node.IsMap() && node[key];
}

std::string Section::required_string(const std::string& key) {
  auto value = optional_string(key);
  if (!value || value->empty()) throw ConfigError(key_path(key) + ": required, but missing");
  return *value;
}

std::string Section::string_or(const std::string& key, std::string fallback) {
  auto value = optional_string(key);
  return value ? *value : std::move(fallback);
}

std::optional<std::string> Section::optional_string(const std::string& key) {
  seen_.insert(key);
  if (!has(key)) return std::nullopt;
  YAML::Node value = (*node_)[key];
  if (value.IsNull()) return std::nullopt;
  if (!value.IsScalar()) throw ConfigError(key_path(key) + ": expected a single value");
  return interpolate(value.Scalar(), key_path(key), env_);
}

long long Section::integer_or(const std::string& key, long long fallback, long long min, long long max) {
  auto value = optional_string(key);
  if (!value) return fallback;
  std::size_t used = 0;
  long long number = 0;
  try {
    number = std::stoll(*value, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != value->size() || number < min || number > max) {
    throw ConfigError(key_path(key) + ": expected a whole number from " + std::to_string(min) + " to " +
                      std::to_string(max) + ", got '" + *value + "'");
  }
  return number;
}

bool Section::boolean_or(const std::string& key, bool fallback) {
  auto value = optional_string(key);
  if (!value) return fallback;
  if (*value == "true") return true;
  if (*value == "false") return false;
  throw ConfigError(key_path(key) + ": expected true or false, got '" + *value + "'");
}

std::chrono::milliseconds Section::duration_or(const std::string& key, std::chrono::milliseconds fallback) {
  auto value = optional_string(key);
  if (!value) return fallback;
  auto parsed = parse_duration(*value);
  if (!parsed) {
    throw ConfigError(key_path(key) + ": expected a duration such as 500ms, 30s, 10m or 1h, got '" + *value + "'");
  }
  return *parsed;
}

std::chrono::milliseconds Section::duration_or(const std::string& key, std::chrono::milliseconds fallback,
                                               std::chrono::milliseconds min, std::chrono::milliseconds max) {
  const auto value = duration_or(key, fallback);
  if (value < min || value > max) {
    throw ConfigError(key_path(key) + ": expected a duration from " + format_duration(min) + " to " +
                      format_duration(max) + ", got " + format_duration(value));
  }
  return value;
}

std::string Section::choice_or(const std::string& key, std::string fallback, const std::vector<std::string>& allowed) {
  auto value = optional_string(key);
  if (!value) return fallback;
  for (const auto& a : allowed) {
    if (*value == a) return a;
  }
  throw ConfigError(key_path(key) + ": unsupported value '" + *value + "', expected one of: " + join(allowed));
}

std::vector<std::string> Section::string_list(const std::string& key) {
  seen_.insert(key);
  std::vector<std::string> out;
  if (!has(key) || (*node_)[key].IsNull()) return out;
  YAML::Node list = (*node_)[key];
  if (!list.IsSequence()) throw ConfigError(key_path(key) + ": expected a list of strings");
  for (std::size_t i = 0; i < list.size(); ++i) {
    const std::string item_path = key_path(key) + "[" + std::to_string(i) + "]";
    if (!list[i].IsScalar()) throw ConfigError(item_path + ": expected a string");
    out.push_back(interpolate(list[i].Scalar(), item_path, env_));
  }
  return out;
}

std::map<std::string, std::string> Section::string_map(const std::string& key) {
  seen_.insert(key);
  std::map<std::string, std::string> out;
  if (!has(key) || (*node_)[key].IsNull()) return out;
  YAML::Node map = (*node_)[key];
  if (!map.IsMap()) throw ConfigError(key_path(key) + ": expected a mapping of strings");
  for (const auto& item : map) {
    const std::string name = item.first.as<std::string>();
    const std::string item_path = key_path(key) + "." + name;
    if (!item.second.IsScalar()) throw ConfigError(item_path + ": expected a string");
    out[name] = interpolate(item.second.Scalar(), item_path, env_);
  }
  return out;
}

std::optional<Section> Section::section(const std::string& key) {
  seen_.insert(key);
  if (!has(key) || (*node_)[key].IsNull()) return std::nullopt;
  return Section(std::make_shared<YAML::Node>((*node_)[key]), key_path(key), env_);
}

std::vector<Section> Section::section_list(const std::string& key) {
  seen_.insert(key);
  std::vector<Section> out;
  if (!has(key) || (*node_)[key].IsNull()) return out;
  YAML::Node list = (*node_)[key];
  if (!list.IsSequence()) throw ConfigError(key_path(key) + ": expected a list");
  for (std::size_t i = 0; i < list.size(); ++i) {
    out.emplace_back(std::make_shared<YAML::Node>(list[i]), key_path(key) + "[" + std::to_string(i) + "]", env_);
  }
  return out;
}

void Section::finish() const {
  const YAML::Node& node = *node_;
  if (!node || !node.IsMap()) return;
  for (const auto& item : node) {
    const std::string key = item.first.as<std::string>();
    if (!seen_.count(key)) {
      std::vector<std::string> known(seen_.begin(), seen_.end());
      throw ConfigError(key_path(key) + ": unknown key (known keys here: " + join(known) + ")");
    }
  }
}

}  // namespace outbox::config
