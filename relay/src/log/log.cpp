#include "log/log.hpp"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <mutex>
#include <vector>

namespace outbox::log {
namespace {

std::atomic<Level> g_level{Level::kInfo};
std::mutex g_mutex;  // guards g_secrets and serializes writes to stderr
std::vector<std::string> g_secrets;

const char* level_name(Level level) {
  switch (level) {
    case Level::kDebug: return "debug";
    case Level::kInfo: return "info";
    case Level::kWarn: return "warn";
    case Level::kError: return "error";
  }
  return "info";
}

std::string percent_encode(const std::string& value) {
  static const char* kHex = "0123456789ABCDEF";
  std::string out;
  for (unsigned char c : value) {
    if (std::isalnum(c) || c == '-' || c == '.' || c == '_' || c == '~') {
      out.push_back(static_cast<char>(c));
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

std::string timestamp() {
  const auto now = std::chrono::system_clock::now();
  const auto secs = std::chrono::system_clock::to_time_t(now);
  const auto micros = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count() % 1000000;
  std::tm tm{};
  gmtime_r(&secs, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, static_cast<long long>(micros));
  return buf;
}

std::string redact_locked(std::string text) {
  for (const auto& secret : g_secrets) {
    for (std::size_t pos = text.find(secret); pos != std::string::npos; pos = text.find(secret, pos + 5)) {
      text.replace(pos, secret.size(), "*****");
    }
  }
  return text;
}

}  // namespace

void set_level(Level level) { g_level = level; }

bool enabled(Level level) { return level >= g_level.load(std::memory_order_relaxed); }

bool parse_level(std::string_view text, Level& level) {
  for (Level l : {Level::kDebug, Level::kInfo, Level::kWarn, Level::kError}) {
    if (text == level_name(l)) {
      level = l;
      return true;
    }
  }
  return false;
}

void add_secret(const std::string& value) {
  if (value.size() < 4) return;
  std::lock_guard lock(g_mutex);
  const std::string quoted = nlohmann::json(value).dump();  // as it looks inside a JSON line
  for (const auto& form : {value, percent_encode(value), quoted.substr(1, quoted.size() - 2)}) {
    if (std::find(g_secrets.begin(), g_secrets.end(), form) == g_secrets.end()) {
      g_secrets.push_back(form);
    }
  }
}

std::string redact(std::string text) {
  std::lock_guard lock(g_mutex);
  return redact_locked(std::move(text));
}

void write(Level level, std::string_view msg, nlohmann::json fields) {
  if (level < g_level.load(std::memory_order_relaxed)) return;
  nlohmann::ordered_json line = nlohmann::ordered_json::object();  // ts, level, msg first
  line["ts"] = timestamp();
  line["level"] = level_name(level);
  line["msg"] = msg;
  if (fields.is_object()) {
    for (auto& [k, v] : fields.items()) line[k] = v;  // json into ordered_json: a copy either way
  }
  std::string text = line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
  std::lock_guard lock(g_mutex);
  text = redact_locked(std::move(text));
  text.push_back('\n');
  std::fwrite(text.data(), 1, text.size(), stderr);
  std::fflush(stderr);
}

}  // namespace outbox::log
