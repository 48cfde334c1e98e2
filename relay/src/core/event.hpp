#pragma once
// Records that travel from the store through the loop to the sinks. Plain data, no I/O.
#include <chrono>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace outbox {

using EventId = std::int64_t;
using Header = std::pair<std::string, std::string>;

struct Event {
  EventId id = 0;
  std::string topic;
  std::string key;                      // aggregate_id: the ordering key and Kafka message key
  std::string payload;                  // the payload as JSON text
  std::string headers_json;             // the row's headers column as JSON text
  std::vector<Header> headers;          // parsed from headers_json by the loop before publishing
  std::string created_at;               // RFC 3339 in UTC, e.g. 2026-11-30T06:32:22.123456Z; "": not a
                                        // time the relay can carry (infinity): dead-lettered
  std::int64_t created_at_us = 0;       // microseconds since the Unix epoch
  int attempts = 0;                     // failed attempts so far
  std::int64_t claimed_at_us = 0;       // when the relay claimed it (us since the Unix epoch), read only
                                        // while tracing is on (RelayLoop::trace_to); else 0
  std::vector<std::string> sinks_done;  // sinks that already acknowledged this event
};

}  // namespace outbox
