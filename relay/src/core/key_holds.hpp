#pragma once
// Per-key order after a failure, in one place. Once an event of a key is not delivered (retried,
// deferred or released), no later event of that key may be delivered before it: the sinks apply
// this within a batch, the loop across batches claimed before the failure was written.
#include <cstddef>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/event.hpp"
#include "core/sink.hpp"

namespace outbox {

class KeyHolds {
 public:
  // The event `id` of `key` was not delivered: the later events of `key` wait behind it.
  void hold(std::string_view key, EventId id);
  // Whether an earlier event of this event's key is held.
  bool holds(const Event& event) const;
  bool holds(std::string_view key) const;
  void merge(const KeyHolds& other);
  void clear() { first_.clear(); }
  bool empty() const { return first_.empty(); }

 private:
  struct KeyHash {
    using is_transparent = void;
    std::size_t operator()(std::string_view key) const { return std::hash<std::string_view>{}(key); }
  };
  // Key -> the smallest held id of that key.
  std::unordered_map<std::string, EventId, KeyHash, std::equal_to<>> first_;
};

// Applies the rule to one sink's answer for a batch (events in id order): an event reported
// delivered after a retried or deferred event of its key becomes a retry with a reason that says
// so. A sink that sends events of one key concurrently (Kafka's pipelined produce) relies on it;
// the loop applies it to every sink's answer, so a sink bug cannot break per-key order.
// Returns how many outcomes it changed.
std::size_t hold_back_after_failures(std::span<const Event* const> events, std::vector<Outcome>& outcomes);

// Pipelined sinks (Sink::pipelined()): which of `next` (a batch about to enter the sinks) must wait
// because an event of its key is still in the sinks (`in_flight`: the batch submitted before,
// whose outcomes are not collected). True at i: next[i] waits until `in_flight` is collected, then
// goes in only if every event of its key there was delivered (else it is released, as a deferred
// event). The loop does not rely on a broker keeping order across submissions: a Redis
// transaction refused as a whole (OOM, LOADING, EXECABORT) may be followed on the same connection
// by one that runs.
std::vector<bool> events_behind(std::span<const Event> next, std::span<const Event> in_flight);

}  // namespace outbox
