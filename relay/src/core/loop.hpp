#pragma once
// One batch at a time: claim, publish to the routed sinks, complete. No I/O of its own: the
// store, sinks, clock and metrics come in through the constructor.
#include <chrono>
#include <cstddef>
#include <functional>
#include <optional>
#include <set>
#include <vector>

#include "core/backoff.hpp"
#include "core/clock.hpp"
#include "core/metrics.hpp"
#include "core/router.hpp"
#include "core/sink.hpp"
#include "core/store.hpp"

namespace outbox {

struct LoopOptions {
  std::size_t batch_size = 500;
  int max_attempts = 20;
  BackoffPolicy backoff;
};

struct BatchResult {
  std::size_t claimed = 0;
  std::size_t delivered = 0;
  std::size_t retried = 0;
  std::size_t dead_lettered = 0;
  std::size_t released = 0;
};

// Parses a headers column (a JSON object of strings). Returns an error text for anything else.
std::optional<std::string> parse_headers(const std::string& json, std::vector<Header>& out);

class RelayLoop {
 public:
  // jitter01 returns uniform numbers in [0, 1). Everything is borrowed and must outlive the loop.
  RelayLoop(Store& store, std::vector<Sink*> sinks, const Router& router, const Clock& clock,
            Metrics& metrics, LoopOptions options, std::function<double()> jitter01);

  // Applies completions left over from a failed complete() (after a reconnect), then claims one
  // batch, publishes it and completes it. Throws StoreUnavailable; the outcomes of a published
  // batch are then kept and applied by the next call, so a lost session costs no re-send.
  BatchResult run_once();

  // Applies completions left over from a failed complete(), if any.
  void flush_pending();

  // The earliest time a retry scheduled by this loop becomes due, if any is outstanding.
  std::optional<Clock::SteadyTime> next_retry_due() const;

  const LoopOptions& options() const { return options_; }

 private:
  std::vector<Completion> decide(std::vector<Event>& events, BatchResult& result);

  Store& store_;
  std::vector<Sink*> sinks_;
  const Router& router_;
  const Clock& clock_;
  Metrics& metrics_;
  LoopOptions options_;
  std::function<double()> jitter01_;
  std::vector<Completion> pending_;
  std::multiset<Clock::SteadyTime> retry_due_;  // bounded; see kMaxTrackedRetries
};

}  // namespace outbox
