#pragma once
// The relay's own spans (docs/operations.md "Tracing"): one span per event per sink attempt, in
// the trace the row's `traceparent` header names. The loop builds SendSpan records only when a
// SpanSink is set (RelayLoop::trace_to); the OTLP exporter that takes them lives in tracing/.
#include <array>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "core/event.hpp"

namespace outbox {

using TraceId = std::array<std::uint8_t, 16>;
using SpanId = std::array<std::uint8_t, 8>;

// A W3C Trace Context `traceparent` value, parsed.
struct TraceParent {
  TraceId trace_id{};
  SpanId span_id{};  // the writer's span: the parent of the relay's
  bool sampled = false;
};

// Parses a traceparent value as W3C Trace Context level 1 says a receiver must: lower-case hex
// only, version "ff" invalid, all-zero trace or parent ids invalid, version 00 exactly 55
// characters; a later version may carry more after the flags, following a '-'. nullopt: invalid.
std::optional<TraceParent> parse_traceparent(std::string_view value);

// Lower-case hex of the bytes (trace and span ids; any digest).
std::string to_hex(const std::uint8_t* bytes, std::size_t size);

// The event's traceparent header (the name in any case; the first one), parsed. Reads
// event.headers, which the loop fills before publishing.
std::optional<TraceParent> event_trace_parent(const Event& event);

// What one span of a send holds; tracing/otlp_json.hpp turns it into OTLP. No payload, no key.
struct SendSpan {
  TraceId trace_id{};              // all zero: a root span (the exporter makes a trace id)
  SpanId parent_span_id{};         // all zero: none
  std::int64_t start_us = 0;       // the claim (wall clock, us since the Unix epoch)
  std::int64_t end_us = 0;         // the sink's acknowledgement or failure
  std::int64_t created_at_us = 0;  // the row's created_at (the database's clock)
  EventId event_id = 0;
  int attempt = 1;          // 1 for the first attempt
  const char* system = "";  // messaging.system (Sink::messaging_system: a static string)
  std::string destination;  // messaging.destination.name
  std::string sink;         // the sink's configured name
  bool failed = false;      // status ERROR with `error` as its message
  std::string error;
};

// Takes the spans of the loop. Implementations never block on I/O and never throw: a span that
// does not fit is dropped and counted. Thread-safe (the loop publishes on helper threads too).
class SpanSink {
 public:
  virtual ~SpanSink() = default;
  // Moves the spans out of `spans` (left empty).
  virtual void submit(std::vector<SendSpan>& spans) = 0;
  // Whether events without a valid traceparent get a root span (tracing.root_spans).
  virtual bool root_spans() const = 0;
};

}  // namespace outbox
