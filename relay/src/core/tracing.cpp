#include "core/tracing.hpp"

#include <algorithm>

#include "core/sink.hpp"

namespace outbox {
namespace {

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;  // upper case too: W3C says lower case only
}

// Reads 2 * out.size() lower-case hex digits of `text` from `pos`.
template <std::size_t N>
bool read_hex(std::string_view text, std::size_t pos, std::array<std::uint8_t, N>& out) {
  for (std::size_t i = 0; i < N; ++i) {
    const int high = hex_value(text[pos + 2 * i]);
    const int low = hex_value(text[pos + 2 * i + 1]);
    if (high < 0 || low < 0) return false;
    out[i] = static_cast<std::uint8_t>(high * 16 + low);
  }
  return true;
}

template <std::size_t N>
bool all_zero(const std::array<std::uint8_t, N>& id) {
  return std::all_of(id.begin(), id.end(), [](std::uint8_t b) { return b == 0; });
}

}  // namespace

std::string to_hex(const std::uint8_t* bytes, std::size_t size) {
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(size * 2, '0');
  for (std::size_t i = 0; i < size; ++i) {
    out[2 * i] = kDigits[bytes[i] >> 4];
    out[2 * i + 1] = kDigits[bytes[i] & 0x0f];
  }
  return out;
}

std::optional<TraceParent> parse_traceparent(std::string_view value) {
  // version "-" trace-id "-" parent-id "-" flags: 2 + 1 + 32 + 1 + 16 + 1 + 2 = 55
  constexpr std::size_t kLength = 55;
  if (value.size() < kLength) return std::nullopt;
  std::array<std::uint8_t, 1> version{};
  std::array<std::uint8_t, 1> flags{};
  TraceParent parent;
  if (!read_hex(value, 0, version) || version[0] == 0xff) return std::nullopt;
  if (value[2] != '-' || value[35] != '-' || value[52] != '-') return std::nullopt;
  if (version[0] == 0 && value.size() != kLength) return std::nullopt;
  if (value.size() > kLength && value[kLength] != '-') return std::nullopt;
  if (!read_hex(value.substr(3), 0, parent.trace_id) || !read_hex(value.substr(36), 0, parent.span_id) ||
      !read_hex(value.substr(53), 0, flags)) {
    return std::nullopt;
  }
  if (all_zero(parent.trace_id) || all_zero(parent.span_id)) return std::nullopt;
  parent.sampled = (flags[0] & 0x01) != 0;
  return parent;
}

std::optional<TraceParent> event_trace_parent(const Event& event) {
  for (const Header& h : event.headers) {
    if (h.first.size() == 11 && header_has_prefix(h.first, "traceparent")) return parse_traceparent(h.second);
  }
  return std::nullopt;
}

}  // namespace outbox
