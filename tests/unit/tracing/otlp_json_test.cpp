// The OTLP JSON encoding of the relay's spans, the traces URL and the bounded span queue.
#include <doctest/doctest.h>

#include <thread>

#include "log/log.hpp"
#include "tracing/otlp_json.hpp"
#include "tracing/span_queue.hpp"

using namespace outbox;
using namespace outbox::tracing;

namespace {

SendSpan span(EventId id) {
  SendSpan s;
  s.trace_id = {0x4b, 0xf9, 0x2f, 0x35, 0x77, 0xb3, 0x4d, 0xa6, 0xa3, 0xce, 0x92, 0x9d, 0x0e, 0x0e, 0x47, 0x36};
  s.parent_span_id = {0x00, 0xf0, 0x67, 0xaa, 0x0b, 0xa9, 0x02, 0xb7};
  s.start_us = 1'700'000'000'123'456;
  s.end_us = 1'700'000'000'223'456;
  s.created_at_us = 1'700'000'000'100'000;
  s.event_id = id;
  s.attempt = 3;
  s.system = "kafka";
  s.destination = "outbox.order.paid";
  s.sink = "events";
  return s;
}

nlohmann::json attribute(const nlohmann::json& attributes, const std::string& key) {
  for (const auto& a : attributes) {
    if (a["key"] == key) return a["value"];
  }
  FAIL("no attribute " << key);
  return {};
}

}  // namespace

TEST_CASE("a span in OTLP JSON: hex ids, nanosecond strings, PRODUCER, messaging attributes") {
  std::uint64_t next = 0x1122334455667788ULL;
  const auto j = encode_spans({span(42)}, {"orders-relay", "host-1-abc", "0.1.0"}, [&] { return next; });
  const auto& rs = j["resourceSpans"][0];
  CHECK(attribute(rs["resource"]["attributes"], "service.name")["stringValue"] == "orders-relay");
  CHECK(attribute(rs["resource"]["attributes"], "service.instance.id")["stringValue"] == "host-1-abc");
  CHECK(attribute(rs["resource"]["attributes"], "service.version")["stringValue"] == "0.1.0");
  CHECK(rs["scopeSpans"][0]["scope"]["name"] == "outbox-relay");
  const auto& s = rs["scopeSpans"][0]["spans"][0];
  CHECK(s["traceId"] == "4bf92f3577b34da6a3ce929d0e0e4736");
  CHECK(s["parentSpanId"] == "00f067aa0ba902b7");
  CHECK(s["spanId"] == "8877665544332211");  // the random bits, low byte first
  CHECK(s["name"] == "send outbox.order.paid");
  CHECK(s["kind"] == 4);
  CHECK(s["startTimeUnixNano"] == "1700000000123456000");
  CHECK(s["endTimeUnixNano"] == "1700000000223456000");
  CHECK_FALSE(s.contains("status"));
  const auto& a = s["attributes"];
  CHECK(attribute(a, "messaging.system")["stringValue"] == "kafka");
  CHECK(attribute(a, "messaging.destination.name")["stringValue"] == "outbox.order.paid");
  CHECK(attribute(a, "messaging.message.id")["stringValue"] == "42");
  CHECK(attribute(a, "messaging.operation.type")["stringValue"] == "send");
  CHECK(attribute(a, "messaging.operation.name")["stringValue"] == "send");
  CHECK(attribute(a, "outbox.sink")["stringValue"] == "events");
  CHECK(attribute(a, "outbox.attempt")["intValue"] == "3");  // int64 as a string, as OTLP JSON says
  CHECK(attribute(a, "outbox.claim_delay_ms")["doubleValue"].get<double>() == doctest::Approx(23.456));
}

TEST_CASE("a failed attempt has status ERROR with the reason; a root span gets a trace id of its own") {
  SendSpan failed = span(7);
  failed.failed = true;
  failed.error = "HTTP 503: maintenance";
  SendSpan root = span(8);
  root.trace_id = {};
  root.parent_span_id = {};
  int calls = 0;
  // The first draw is zero: an all-zero id is drawn again.
  const auto j = encode_spans({failed, root}, {"s", "i", "v"},
                              [&]() -> std::uint64_t { return calls++ == 0 ? 0 : 0x0102030405060708ULL; });
  const auto& spans = j["resourceSpans"][0]["scopeSpans"][0]["spans"];
  REQUIRE(spans.size() == 2);
  CHECK(spans[0]["status"]["code"] == 2);
  CHECK(spans[0]["status"]["message"] == "HTTP 503: maintenance");
  CHECK(spans[0]["spanId"] == "0807060504030201");
  CHECK_FALSE(spans[1].contains("parentSpanId"));
  CHECK(spans[1]["traceId"] == "08070605040302010807060504030201");
  CHECK(spans[1]["traceId"] != std::string(32, '0'));
}

TEST_CASE("a failed attempt's reason has the registered secrets masked, as in the logs") {
  log::add_secret("span-secret-4f1c");
  SendSpan failed = span(9);
  failed.failed = true;
  failed.error = "connect to https://user:span-secret-4f1c@broker.example/ failed";
  const auto j = encode_spans({failed}, {"s", "i", "v"}, [] { return 0x0102030405060708ULL; });
  const std::string message = j["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["status"]["message"];
  CHECK(message.find("span-secret-4f1c") == std::string::npos);
  CHECK(message.find("*****") != std::string::npos);
}

TEST_CASE("the traces URL: /v1/traces unless the endpoint names a path") {
  CHECK(traces_url("http://127.0.0.1:4318") == "http://127.0.0.1:4318/v1/traces");
  CHECK(traces_url("http://127.0.0.1:4318/") == "http://127.0.0.1:4318/v1/traces");
  CHECK(traces_url("https://otel.example.com/custom/traces") == "https://otel.example.com/custom/traces");
}

TEST_CASE("the span queue keeps at most its capacity and says how many it dropped") {
  SpanQueue q(5, 2);
  std::vector<SendSpan> in{span(1), span(2), span(3)};
  CHECK(q.push(in) == 0);
  CHECK(in.empty());
  in = {span(4), span(5), span(6), span(7)};
  CHECK(q.push(in) == 2);  // the newest that did not fit
  CHECK(q.size() == 5);
  std::vector<SendSpan> out;
  REQUIRE(q.take(out, std::chrono::milliseconds{0}));
  REQUIRE(out.size() == 2);  // one batch at most
  CHECK(out[0].event_id == 1);
  CHECK(out[1].event_id == 2);
  in = {span(8), span(9)};
  CHECK(q.push(in) == 0);
  q.stop();
  std::vector<EventId> rest;
  while (q.take(out, std::chrono::milliseconds{0})) {
    for (const auto& s : out) rest.push_back(s.event_id);
  }
  CHECK(rest == std::vector<EventId>{3, 4, 5, 8, 9});
  CHECK(q.stopped());
}

TEST_CASE("take() wakes when a batch is queued, before its wait ends") {
  SpanQueue q(100, 3);
  std::thread producer([&] {
    std::vector<SendSpan> in{span(1), span(2), span(3)};
    q.push(in);
  });
  std::vector<SendSpan> out;
  const auto started = std::chrono::steady_clock::now();
  REQUIRE(q.take(out, std::chrono::seconds{30}));
  producer.join();
  CHECK(out.size() == 3);
  CHECK(std::chrono::steady_clock::now() - started < std::chrono::seconds{10});
}
