// The CloudEvents envelope: pure rendering, checked against the spec's rules.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include "sinks/envelope.hpp"

using namespace outbox;
using namespace outbox::sinks;

namespace {

Event sample() {
  Event e;
  e.id = 42;
  e.topic = "order.paid";
  e.key = "order-7";
  e.payload = R"({"total":12.5})";
  e.created_at = "2026-12-01T06:32:22.123456Z";
  e.headers = {{"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
               {"X-Custom", "dropped"},
               {"type", "forged"},
               {"abcdefghij0123456789", "20 chars: kept"},
               {"abcdefghij0123456789x", "21 chars: dropped"}};
  return e;
}

}  // namespace

TEST_CASE("extension attribute names: lower-case letters and digits, 1-20, not a context attribute") {
  CHECK(is_cloudevents_extension_name("traceparent"));
  CHECK(is_cloudevents_extension_name("tracestate"));
  CHECK(is_cloudevents_extension_name("a1"));
  CHECK_FALSE(is_cloudevents_extension_name(""));
  CHECK_FALSE(is_cloudevents_extension_name("X-Custom"));
  CHECK_FALSE(is_cloudevents_extension_name("trace_parent"));
  CHECK_FALSE(is_cloudevents_extension_name("Traceparent"));
  CHECK_FALSE(is_cloudevents_extension_name(std::string(21, 'a')));
  for (const char* reserved : {"id", "source", "type", "specversion", "subject", "time", "data", "datacontenttype",
                               "dataschema", "data_base64"}) {
    CHECK_FALSE(is_cloudevents_extension_name(reserved));
  }
}

TEST_CASE("binary mode attributes: context attributes in order, then the valid extensions") {
  const Envelope envelope{EnvelopeFormat::kCloudEvents, "outbox-relay/app/outbox_events"};
  const auto attributes = cloudevents_attributes(sample(), envelope);
  const std::vector<std::pair<std::string, std::string>> expected{
      {"specversion", "1.0"},
      {"id", "42"},
      {"source", "outbox-relay/app/outbox_events"},
      {"type", "order.paid"},
      {"time", "2026-12-01T06:32:22.123456Z"},
      {"subject", "order-7"},
      {"traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
      {"abcdefghij0123456789", "20 chars: kept"},
  };
  CHECK(attributes == expected);
  Event keyless = sample();
  keyless.key.clear();
  for (const auto& [name, value] : cloudevents_attributes(keyless, envelope)) CHECK(name != "subject");
}

TEST_CASE("structured mode: one JSON object per line with the payload as data") {
  std::string out;
  append_structured_cloudevent(sample(), Envelope{EnvelopeFormat::kCloudEvents, "src"}, out);
  REQUIRE(out.back() == '\n');
  const auto j = nlohmann::json::parse(out);
  CHECK(j["specversion"] == "1.0");
  CHECK(j["id"] == "42");
  CHECK(j["source"] == "src");
  CHECK(j["datacontenttype"] == "application/json");
  CHECK(j["data"] == nlohmann::json{{"total", 12.5}});
  CHECK(j["type"] == "order.paid");  // the row header "type" did not override it
  CHECK_FALSE(j.contains("X-Custom"));
}

TEST_CASE("HTTP header values are percent-encoded outside printable ASCII, and space, quote, percent") {
  CHECK(percent_encode_header_value("order.paid") == "order.paid");
  CHECK(percent_encode_header_value("a b\"c%d") == "a%20b%22c%25d");
  CHECK(percent_encode_header_value("\xc3\xbc\r\n") == "%C3%BC%0D%0A");
  CHECK(percent_encode_header_value("") == "");
}
