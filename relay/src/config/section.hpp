#pragma once
// Typed, strict reading of one YAML mapping: every value is ${ENV}-interpolated, every error
// names the full key path and what was expected, and finish() rejects keys nobody read.
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

// yaml-cpp is a private dependency of config/: outside it a YAML mapping is an opaque handle.
namespace YAML {
class Node;
}  // namespace YAML

namespace outbox::config {

// One YAML mapping as written (config.cpp parses it; section.cpp reads it).
using YamlNode = std::shared_ptr<YAML::Node>;

// Bad configuration: the message names the key. The CLI prints it and exits 2.
class ConfigError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Looks up an environment variable; nullopt when unset. Injected so tests need no setenv.
using EnvLookup = std::function<std::optional<std::string>(const std::string&)>;
EnvLookup process_env();

// Replaces ${NAME}, ${NAME:-default} and ${file:/path} (the file's content, trailing newlines
// trimmed) in text. `key` names the value in errors.
std::string interpolate(const std::string& text, const std::string& key, const EnvLookup& env);

// Runs one step of reading a config. Without errors, as it is (a ConfigError escapes); with them, a
// ConfigError of the step is kept there and false returned, so that the reading goes on (`config
// check` lists every error of a file).
template <class Fn>
bool collect_errors(std::vector<std::string>* errors, Fn&& fn) {
  if (errors == nullptr) {
    fn();
    return true;
  }
  try {
    fn();
    return true;
  } catch (const ConfigError& e) {
    errors->emplace_back(e.what());
    return false;
  }
}

class Section {
 public:
  Section(YamlNode node, std::string path, const EnvLookup& env);

  const std::string& path() const { return path_; }
  const YamlNode& node() const { return node_; }
  bool has(const std::string& key) const;

  std::string required_string(const std::string& key);
  std::string string_or(const std::string& key, std::string fallback);
  std::optional<std::string> optional_string(const std::string& key);
  long long integer_or(const std::string& key, long long fallback, long long min, long long max);
  bool boolean_or(const std::string& key, bool fallback);
  std::chrono::milliseconds duration_or(const std::string& key, std::chrono::milliseconds fallback);
  // The same, and the duration must lie within [min, max]; the error names both.
  std::chrono::milliseconds duration_or(const std::string& key, std::chrono::milliseconds fallback,
                                        std::chrono::milliseconds min, std::chrono::milliseconds max);
  // One of `allowed`; the error lists them.
  std::string choice_or(const std::string& key, std::string fallback, const std::vector<std::string>& allowed);
  std::vector<std::string> string_list(const std::string& key);           // absent: empty
  std::map<std::string, std::string> string_map(const std::string& key);  // absent: empty
  std::optional<Section> section(const std::string& key);                 // absent: nullopt
  std::vector<Section> section_list(const std::string& key);              // absent: empty

  // Throws ConfigError naming the first key that no getter asked for.
  void finish() const;

  std::string key_path(const std::string& key) const;

 private:
  YamlNode node_;  // never null
  std::string path_;
  const EnvLookup& env_;
  std::set<std::string> seen_;
};

}  // namespace outbox::config
