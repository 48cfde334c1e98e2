#include "tracing/otlp_json.hpp"

#include "log/log.hpp"

namespace outbox::tracing {
namespace {

constexpr int kSpanKindProducer = 4;  // opentelemetry.proto.trace.v1.Span.SpanKind
constexpr int kStatusError = 2;       // opentelemetry.proto.trace.v1.Status.StatusCode

nlohmann::json string_attribute(const char* key, const std::string& value) {
  return {{"key", key}, {"value", {{"stringValue", value}}}};
}

nlohmann::json int_attribute(const char* key, std::int64_t value) {
  return {{"key", key}, {"value", {{"intValue", std::to_string(value)}}}};
}

nlohmann::json double_attribute(const char* key, double value) {
  return {{"key", key}, {"value", {{"doubleValue", value}}}};
}

std::string nanos(std::int64_t us) { return std::to_string(us) + "000"; }

template <std::size_t N>
void fill_random(std::array<std::uint8_t, N>& id, const RandomBits& random) {
  bool zero = true;
  while (zero) {
    for (std::size_t i = 0; i < N; i += 8) {
      std::uint64_t bits = random();
      for (std::size_t b = 0; b < 8 && i + b < N; ++b) {
        id[i + b] = static_cast<std::uint8_t>(bits & 0xff);
        bits >>= 8;
      }
    }
    for (const auto byte : id) zero = zero && byte == 0;
  }
}

template <std::size_t N>
bool is_zero(const std::array<std::uint8_t, N>& id) {
  for (const auto byte : id) {
    if (byte != 0) return false;
  }
  return true;
}

template <std::size_t N>
std::string hex(const std::array<std::uint8_t, N>& id) {
  return to_hex(id.data(), N);
}

}  // namespace

nlohmann::json encode_spans(const std::vector<SendSpan>& spans, const Resource& resource, const RandomBits& random) {
  nlohmann::json out = nlohmann::json::array();
  for (const SendSpan& s : spans) {
    TraceId trace_id = s.trace_id;
    if (is_zero(trace_id)) fill_random(trace_id, random);  // a root span: a trace of its own
    SpanId span_id{};
    fill_random(span_id, random);
    nlohmann::json span = {
        {"traceId", hex(trace_id)},
        {"spanId", hex(span_id)},
        {"name", "send " + s.destination},
        {"kind", kSpanKindProducer},
        {"startTimeUnixNano", nanos(s.start_us)},
        {"endTimeUnixNano", nanos(s.end_us)},
        {"attributes",
         {string_attribute("messaging.system", s.system), string_attribute("messaging.destination.name", s.destination),
          string_attribute("messaging.message.id", std::to_string(s.event_id)),
          string_attribute("messaging.operation.type", "send"), string_attribute("messaging.operation.name", "send"),
          string_attribute("outbox.sink", s.sink), int_attribute("outbox.attempt", s.attempt),
          double_attribute("outbox.claim_delay_ms", static_cast<double>(s.start_us - s.created_at_us) / 1000.0)}},
    };
    if (!is_zero(s.parent_span_id)) span["parentSpanId"] = hex(s.parent_span_id);
    // The reason as in last_error, with every registered secret masked as in the logs: a broker's
    // or a client library's error text may quote a URL or a credential.
    if (s.failed) span["status"] = {{"code", kStatusError}, {"message", log::redact(s.error)}};
    out.push_back(std::move(span));
  }
  return {{"resourceSpans",
           {{{"resource",
              {{"attributes",
                {string_attribute("service.name", resource.service_name),
                 string_attribute("service.instance.id", resource.instance_id),
                 string_attribute("service.version", resource.version)}}}},
             {"scopeSpans",
              {{{"scope", {{"name", "outbox-relay"}, {"version", resource.version}}}, {"spans", std::move(out)}}}}}}}};
}

std::string traces_url(const std::string& endpoint) {
  const auto scheme = endpoint.find("://");
  const auto path = scheme == std::string::npos ? std::string::npos : endpoint.find('/', scheme + 3);
  if (path == std::string::npos) return endpoint + "/v1/traces";
  if (endpoint.compare(path, std::string::npos, "/") == 0) return endpoint.substr(0, path) + "/v1/traces";
  return endpoint;
}

}  // namespace outbox::tracing
