#pragma once
// JSON Lines logging on stderr: {"ts","level","msg", ...fields}. Thread-safe.
// Registered secrets are replaced by ***** in every line, whatever field they hide in.
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>

namespace outbox::log {

enum class Level { kDebug = 0, kInfo = 1, kWarn = 2, kError = 3 };

void set_level(Level level);
// Whether a line of this level is written (to skip building the fields of one that is not).
bool enabled(Level level);
// Accepts debug|info|warn|error. False for anything else.
bool parse_level(std::string_view text, Level& level);
// Masks value (and its percent-encoded form) in every later line. Values shorter than 4
// characters are ignored: masking them would garble ordinary words.
void add_secret(const std::string& value);
// Returns text with every registered secret masked.
std::string redact(std::string text);

void write(Level level, std::string_view msg, nlohmann::json fields = nlohmann::json::object());
inline void debug(std::string_view msg, nlohmann::json fields = nlohmann::json::object()) {
  write(Level::kDebug, msg, std::move(fields));
}
inline void info(std::string_view msg, nlohmann::json fields = nlohmann::json::object()) {
  write(Level::kInfo, msg, std::move(fields));
}
inline void warn(std::string_view msg, nlohmann::json fields = nlohmann::json::object()) {
  write(Level::kWarn, msg, std::move(fields));
}
inline void error(std::string_view msg, nlohmann::json fields = nlohmann::json::object()) {
  write(Level::kError, msg, std::move(fields));
}

}  // namespace outbox::log
