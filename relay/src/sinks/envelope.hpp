#pragma once
// The event envelope a sink writes: `format: json` (the relay's own, the default) or
// `format: cloudevents` (CloudEvents 1.0: binary content mode for Kafka and HTTP, structured mode
// for JSON Lines). The registry reads the two keys for every sink (sinks/registry.hpp); a sink
// whose settings carry an `Envelope envelope` member supports both.
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/event.hpp"

namespace outbox::sinks {

enum class EnvelopeFormat { kJson, kCloudEvents };

struct Envelope {
  EnvelopeFormat format = EnvelopeFormat::kJson;
  std::string source;  // CloudEvents `source`; default outbox-relay/<database>/<table>
};

// Whether a row header becomes a CloudEvents extension attribute: lower-case letters and digits,
// 1 to 20 characters, and not one of the spec's own attribute names (id, type, data, ...).
bool is_cloudevents_extension_name(std::string_view name);

// The context attributes of an event and its extensions, in binary content mode (names without
// a binding's prefix): specversion, id, source, type (the row's topic), time (created_at),
// subject (the key, when not empty), then each row header that is a valid extension name. Other
// headers are dropped in this mode.
std::vector<std::pair<std::string, std::string>> cloudevents_attributes(const Event& event, const Envelope& envelope);

// The HTTP binding's encoding of an attribute value in a header: space, '"', '%' and every byte
// outside printable ASCII (UTF-8 bytes included) as %XX.
std::string percent_encode_header_value(std::string_view value);

// Structured content mode: one JSON CloudEvent with the payload as `data` and
// `datacontenttype: application/json`, plus a newline.
void append_structured_cloudevent(const Event& event, const Envelope& envelope, std::string& out);

// The relay's own JSON record of an event (with a trailing newline), as JSON Lines and batched
// webhook requests carry it: {"id","topic","key","payload","headers","created_at"}.
void append_json_line(const Event& event, std::string& out);
// The record in the envelope's format: append_json_line, or a structured CloudEvent.
void append_record(const Event& event, const Envelope& envelope, std::string& out);

}  // namespace outbox::sinks
