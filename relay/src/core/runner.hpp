#pragma once
// Drives the loop: polls the store (Store::probe_claim) every poll_interval while events flow and
// every idle_poll_interval once they stop; drains at once on a bell (LISTEN), a sweep tick, a due
// retry or lanes gained, until a claim comes back short; reconnects with backoff when the store is
// unavailable. README "How wakeups work".
#include <chrono>
#include <functional>

#include "core/backoff.hpp"
#include "core/bell.hpp"
#include "core/health.hpp"
#include "core/loop.hpp"

namespace outbox {

struct RunnerOptions {
  std::chrono::milliseconds sweep_interval{30000};
  std::chrono::milliseconds rebalance_interval{5000};
  // Polls while events flow, or while a claim is held back by an open writer (whose commit or
  // rollback rings nothing): events wait up to this long, and a steady stream is claimed in
  // batches of what arrived meanwhile.
  std::chrono::milliseconds poll_interval{5};
  // Once nothing new was found for idle_after, the interval grows to idle_poll_interval: what an
  // idle relay costs.
  std::chrono::milliseconds idle_poll_interval{100};
  std::chrono::milliseconds idle_after{2000};
  BackoffPolicy reconnect{std::chrono::milliseconds{500}, std::chrono::milliseconds{30000}};
};

class Runner {
 public:
  Runner(RelayLoop& loop, Store& store, Bell& bell, Metrics& metrics, Health& health,
         RunnerOptions options, std::function<double()> jitter01);

  // Runs on the calling thread until bell.stop(). The batch in flight when stop arrives is
  // finished and completed before this returns. Never throws StoreUnavailable.
  void run();

 private:
  // Returns how many events were claimed.
  std::size_t drain(bool probe);
  void maybe_rebalance();

  RelayLoop& loop_;
  Store& store_;
  Bell& bell_;
  Metrics& metrics_;
  Health& health_;
  RunnerOptions options_;
  std::function<double()> jitter01_;
  std::chrono::steady_clock::time_point next_rebalance_{};
};

}  // namespace outbox
