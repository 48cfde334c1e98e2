#include "sinks/envelope.hpp"

#include <algorithm>
#include <array>
#include <nlohmann/json.hpp>

namespace outbox::sinks {
namespace {

// CloudEvents 1.0 context attributes, and the structured mode's data members.
constexpr std::array<std::string_view, 10> kReserved{
    "specversion", "id", "source", "type", "subject", "time", "data", "datacontenttype", "dataschema", "data_base64"};

std::string json_string(const std::string& text) {
  return nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

}  // namespace

bool is_cloudevents_extension_name(std::string_view name) {
  if (name.empty() || name.size() > 20) return false;
  const bool lower_alnum =
      std::all_of(name.begin(), name.end(), [](char c) { return (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'); });
  return lower_alnum && std::find(kReserved.begin(), kReserved.end(), name) == kReserved.end();
}

std::vector<std::pair<std::string, std::string>> cloudevents_attributes(const Event& event, const Envelope& envelope) {
  std::vector<std::pair<std::string, std::string>> out{
      {"specversion", "1.0"}, {"id", std::to_string(event.id)}, {"source", envelope.source},
      {"type", event.topic},  {"time", event.created_at},
  };
  if (!event.key.empty()) out.emplace_back("subject", event.key);
  for (const auto& [name, value] : event.headers) {
    if (is_cloudevents_extension_name(name)) out.emplace_back(name, value);
  }
  return out;
}

std::string percent_encode_header_value(std::string_view value) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(value.size());
  for (const char ch : value) {
    const auto byte = static_cast<unsigned char>(ch);
    if (byte > 0x20 && byte < 0x7f && byte != '"' && byte != '%') {
      out += ch;
    } else {
      out += '%';
      out += kHex[byte >> 4];
      out += kHex[byte & 0xf];
    }
  }
  return out;
}

void append_structured_cloudevent(const Event& event, const Envelope& envelope, std::string& out) {
  out += '{';
  for (const auto& [name, value] : cloudevents_attributes(event, envelope)) {
    out += json_string(name);
    out += ':';
    out += json_string(value);
    out += ',';
  }
  out += "\"datacontenttype\":\"application/json\",\"data\":";
  out += event.payload;  // already JSON text from Postgres
  out += "}\n";
}

void append_json_line(const Event& e, std::string& out) {
  out += "{\"id\":";
  out += std::to_string(e.id);
  out += ",\"topic\":";
  out += json_string(e.topic);
  out += ",\"key\":";
  out += json_string(e.key);
  out += ",\"payload\":";
  out += e.payload;  // already JSON text from Postgres
  out += ",\"headers\":";
  out += e.headers_json.empty() ? "{}" : e.headers_json;
  out += ",\"created_at\":\"";
  out += e.created_at;
  out += "\"}\n";
}

void append_record(const Event& event, const Envelope& envelope, std::string& out) {
  if (envelope.format == EnvelopeFormat::kCloudEvents) {
    append_structured_cloudevent(event, envelope, out);
  } else {
    append_json_line(event, out);
  }
}

}  // namespace outbox::sinks
