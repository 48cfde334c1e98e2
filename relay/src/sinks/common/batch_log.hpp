#pragma once
// The end of a sink's publish() in the log, one summary for every sink: a warn line when an
// event of the batch was retried or dead-lettered, with the count of each outcome and the first
// failure's reason.
#include <cstddef>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <string_view>

#include "core/sink.hpp"

namespace outbox::sinks {

// How many events of a batch got each outcome. Pure.
struct BatchSummary {
  std::size_t delivered = 0;
  std::size_t retry = 0;
  std::size_t permanent = 0;
  std::size_t deferred = 0;
  // The first retried or dead-lettered event's outcome (points into the outcomes summed), or
  // null: nothing failed (deferred events were not attempted, so they are no failure).
  const Outcome* first_failure = nullptr;

  static BatchSummary of(std::span<const Outcome> outcomes);
};

// Logs "<type> batch not fully delivered" at warn when an event of the batch was retried or
// dead-lettered, with the fields sink, delivered, retry, permanent, deferred and first_error,
// plus `extra` (a sink's own, e.g. rabbitmq's rounds and ms). Returns whether it logged.
bool log_batch(std::string_view type, const std::string& sink, std::span<const Outcome> outcomes,
               const nlohmann::json& extra = nlohmann::json::object());

}  // namespace outbox::sinks
