#pragma once
// Drives the loop: waits for a bell, a sweep tick, a due retry or a rebalance tick, drains until
// a claim comes back short, and reconnects with backoff when the store is unavailable.
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
  // How soon to look again when a claim was held back by an open writer.
  std::chrono::milliseconds writer_poll{100};
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
  void drain();
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
