#pragma once
// The relay's spans in OTLP's JSON encoding (an ExportTraceServiceRequest, as POSTed to
// /v1/traces): ids as lower-case hex, times as decimal strings of Unix nanoseconds, int64
// attributes as decimal strings. Pure: tested on its own (tests/unit/tracing).
#include <cstdint>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/tracing.hpp"

namespace outbox::tracing {

// The resource every span of this process belongs to.
struct Resource {
  std::string service_name;  // service.name (tracing.service_name)
  std::string instance_id;   // service.instance.id (relay.instance_id or the generated one)
  std::string version;       // service.version, and the instrumentation scope's version
};

// 64 random bits a call, for span ids (and trace ids of root spans). Never all zero twice in a row
// in practice; an all-zero id drawn is drawn again.
using RandomBits = std::function<std::uint64_t()>;

// Each span: name "send <destination>", kind PRODUCER, parent the row's span; status ERROR with
// the reason on a failed attempt (unset otherwise); attributes messaging.system,
// messaging.destination.name, messaging.message.id (the event id), messaging.operation.type and
// .name ("send"), outbox.sink, outbox.attempt and outbox.claim_delay_ms (docs/operations.md).
nlohmann::json encode_spans(const std::vector<SendSpan>& spans, const Resource& resource, const RandomBits& random);

// The URL spans are POSTed to: tracing.otlp_endpoint as written, with /v1/traces appended when it
// names no path (as OTEL_EXPORTER_OTLP_ENDPOINT does): "http://c:4318" -> "http://c:4318/v1/traces".
std::string traces_url(const std::string& endpoint);

}  // namespace outbox::tracing
