// W3C traceparent parsing: what a receiver must refuse (Trace Context level 1, "traceparent").
#include <doctest/doctest.h>

#include <string>

#include "core/tracing.hpp"

using namespace outbox;

namespace {
const std::string kValid = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
}

TEST_CASE("a valid traceparent gives its trace id, parent id and sampled flag") {
  const auto p = parse_traceparent(kValid);
  REQUIRE(p.has_value());
  CHECK(p->trace_id[0] == 0x4b);
  CHECK(p->trace_id[15] == 0x36);
  CHECK(p->span_id[0] == 0x00);
  CHECK(p->span_id[7] == 0xb7);
  CHECK(p->sampled);
  const auto unsampled = parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00");
  REQUIRE(unsampled.has_value());
  CHECK_FALSE(unsampled->sampled);
  // Other flag bits do not hide the sampled bit.
  CHECK(parse_traceparent("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-03")->sampled);
}

TEST_CASE("invalid traceparents are refused") {
  const char* invalid[] = {
      "",
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0",    // short
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-011",  // version 00 is exactly 55
      "00-4bf92f3577b34da6a3ce929d0e0e473-600f067aa0ba902b7-01",   // dashes in the wrong places
      "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",   // upper case trace id
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00F067AA0BA902B7-01",   // upper case parent id
      "0A-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // upper case version
      "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0A",   // upper case flags
      "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",   // version ff
      "00-00000000000000000000000000000000-00f067aa0ba902b7-01",   // zero trace id
      "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",   // zero parent id
      "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",   // not hex
      "00_4bf92f3577b34da6a3ce929d0e0e4736_00f067aa0ba902b7_01",   // separators
      " 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",  // leading blank
      "01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01x",  // later version: '-' after flags
  };
  for (const char* value : invalid) {
    CAPTURE(value);
    CHECK_FALSE(parse_traceparent(value).has_value());
  }
}

TEST_CASE("a later version may carry more after the flags") {
  CHECK(parse_traceparent("01-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").has_value());
  CHECK(parse_traceparent("cc-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-what-the-future-holds").has_value());
}

TEST_CASE("the event's traceparent header is found in any case; none or an invalid one gives nothing") {
  Event e;
  CHECK_FALSE(event_trace_parent(e).has_value());
  e.headers = {{"tracestate", "rojo=1"}, {"TraceParent", kValid}};
  CHECK(event_trace_parent(e).has_value());
  e.headers = {{"traceparent-x", kValid}, {"x-traceparent", kValid}};
  CHECK_FALSE(event_trace_parent(e).has_value());
  e.headers = {{"traceparent", "garbage"}};
  CHECK_FALSE(event_trace_parent(e).has_value());
}
