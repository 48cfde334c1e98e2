#pragma once
#include <chrono>
#include <optional>
#include <string>
#include <string_view>

namespace outbox::config {

// Parses "500ms", "30s", "10m", "1h", "7d", "1.5s" and sums like "1m30s". No bare numbers,
// no negatives. nullopt on anything else.
std::optional<std::chrono::milliseconds> parse_duration(std::string_view text);

// "1m30s"-style text for logs.
std::string format_duration(std::chrono::milliseconds d);

}  // namespace outbox::config
