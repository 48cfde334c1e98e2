#include <doctest/doctest.h>

#include "config/duration.hpp"

using outbox::config::format_duration;
using outbox::config::parse_duration;
using std::chrono::milliseconds;

TEST_CASE("durations parse with units and sums") {
  CHECK(parse_duration("500ms") == milliseconds(500));
  CHECK(parse_duration("30s") == milliseconds(30'000));
  CHECK(parse_duration("10m") == milliseconds(600'000));
  CHECK(parse_duration("1h") == milliseconds(3'600'000));
  CHECK(parse_duration("7d") == milliseconds(604'800'000));
  CHECK(parse_duration("1.5s") == milliseconds(1500));
  CHECK(parse_duration("1m30s") == milliseconds(90'000));
  CHECK(parse_duration("0s") == milliseconds(0));
}

TEST_CASE("durations reject bare numbers, unknown units and junk") {
  for (const char* bad : {"", "30", "5 s", "-1s", "1x", "s", "1..5s", ".s", "1sec", "ms", "1s 2s", "1e3s"}) {
    CAPTURE(bad);
    CHECK_FALSE(parse_duration(bad).has_value());
  }
}

TEST_CASE("durations format back compactly") {
  CHECK(format_duration(milliseconds(90'000)) == "1m30s");
  CHECK(format_duration(milliseconds(0)) == "0s");
  CHECK(format_duration(milliseconds(1500)) == "1s500ms");
  CHECK(format_duration(milliseconds(3'600'000)) == "1h");
}
