#include "config/duration.hpp"

#include <cctype>
#include <cmath>
#include <cstdlib>

namespace outbox::config {

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text) {
  if (text.empty()) return std::nullopt;
  double total_ms = 0;
  std::size_t i = 0;
  while (i < text.size()) {
    const std::size_t start = i;
    bool dot = false;
    while (i < text.size() && (std::isdigit(static_cast<unsigned char>(text[i])) || (text[i] == '.' && !dot))) {
      if (text[i] == '.') dot = true;
      ++i;
    }
    if (i == start || (i == start + 1 && dot)) return std::nullopt;
    const double number = std::strtod(std::string(text.substr(start, i - start)).c_str(), nullptr);
    const std::size_t unit_start = i;
    while (i < text.size() && std::isalpha(static_cast<unsigned char>(text[i]))) ++i;
    const std::string_view unit = text.substr(unit_start, i - unit_start);
    double scale = 0;
    if (unit == "ms")
      scale = 1;
    else if (unit == "s")
      scale = 1000;
    else if (unit == "m")
      scale = 60'000;
    else if (unit == "h")
      scale = 3'600'000;
    else if (unit == "d")
      scale = 86'400'000;
    else
      return std::nullopt;
    total_ms += number * scale;
  }
  if (!std::isfinite(total_ms) || total_ms > 1e15) return std::nullopt;
  return std::chrono::milliseconds(static_cast<long long>(std::llround(total_ms)));
}

std::string format_duration(std::chrono::milliseconds d) {
  long long ms = d.count();
  if (ms == 0) return "0s";
  std::string out;
  const struct {
    long long size;
    const char* unit;
  } parts[] = {{86'400'000, "d"}, {3'600'000, "h"}, {60'000, "m"}, {1000, "s"}, {1, "ms"}};
  for (const auto& p : parts) {
    if (ms >= p.size) {
      out += std::to_string(ms / p.size) + p.unit;
      ms %= p.size;
    }
  }
  return out;
}

}  // namespace outbox::config
