#include "core/runner.hpp"

#include <algorithm>

#include "log/log.hpp"

namespace outbox {

Runner::Runner(RelayLoop& loop, Store& store, Bell& bell, Metrics& metrics, Health& health,
               RunnerOptions options, std::function<double()> jitter01)
    : loop_(loop),
      store_(store),
      bell_(bell),
      metrics_(metrics),
      health_(health),
      options_(options),
      jitter01_(std::move(jitter01)) {}

void Runner::maybe_rebalance() {
  const auto now = std::chrono::steady_clock::now();
  if (now < next_rebalance_) return;
  next_rebalance_ = now + options_.rebalance_interval;
  store_.rebalance();  // lanes gained are caught up by the drain in progress or the next one
}

std::size_t Runner::drain(bool probe) {
  // A full drain clears the bell: rings from here on wake the next wait, so nothing committed
  // later is missed. A poll leaves it: a ring it did not look for (a LISTEN session restored,
  // asking for a catch-up) still gets its full drain.
  if (!probe) bell_.clear();
  DrainControl control;
  control.probe = probe;
  control.stop = [this] { return bell_.stopped(); };
  // Between batches, so a long backlog does not keep lanes from new peers.
  control.pause_due = [this] { return std::chrono::steady_clock::now() >= next_rebalance_; };
  control.pause = [this] { maybe_rebalance(); };
  const BatchResult r = loop_.drain(control);
  if (r.retried + r.dead_lettered > 0) {
    log::debug("drain done", {{"claimed", r.claimed}, {"delivered", r.delivered}, {"released", r.released},
                              {"retried", r.retried}, {"dead_lettered", r.dead_lettered}});
  }
  return r.claimed;
}

void Runner::run() {
  using Steady = std::chrono::steady_clock;
  auto now = Steady::now();
  auto next_sweep = now + options_.sweep_interval;
  auto last_found = now;  // when a drain or poll last claimed something
  next_rebalance_ = now;
  int failures = 0;
  bool drain_needed = true;  // catch up at start
  bool poll_due = false;
  auto polled_at = now;  // when the last drain or poll started
  auto poll_every = options_.poll_interval;
  health_.loop_running = true;

  while (!bell_.stopped()) {
    try {
      store_.connect();
      if (failures > 0) {
        metrics_.reconnected();
        log::info("database session restored", {{"after_attempts", failures}});
        failures = 0;
        drain_needed = true;
        loop_.flush_pending();
      }
      health_.store_up = true;
      now = Steady::now();
      if (now >= next_rebalance_) {
        // A poll's outcomes first: its events carry no lease, and lanes handed over now would
        // hand them out again (Store::probe_claim).
        loop_.flush_pending();
        if (store_.rebalance()) drain_needed = true;
        next_rebalance_ = now + options_.rebalance_interval;
      }
      // Polls are paced from the start of the previous one, so that an event waits at most about
      // one poll_interval for the poll that claims it, whatever that poll's own work took.
      if (drain_needed || poll_due) {
        polled_at = Steady::now();
        const bool probe = !drain_needed;
        if (drain(probe) > 0) {
          last_found = Steady::now();
          if (probe) metrics_.wakeup(WakeSource::kPoll);
        }
      }
      if (bell_.stopped()) break;

      now = Steady::now();
      const bool flowing =
          now - last_found < options_.idle_after || store_.waiting_for_writers() || loop_.has_pending();
      // Once events stop, the interval grows by half each poll up to idle_poll_interval (~0.4 s to
      // get there from 5 ms): a stream that pauses for a moment still finds a fast poll.
      poll_every = flowing ? options_.poll_interval
                           : std::min(options_.idle_poll_interval, poll_every + poll_every / 2);
      const auto next_poll = polled_at + poll_every;
      auto deadline = std::min({next_sweep, next_rebalance_, next_poll});
      if (auto due = loop_.next_retry_due()) deadline = std::min(deadline, *due);
      const auto source = bell_.wait_until(deadline);
      if (bell_.stopped()) break;
      now = Steady::now();
      drain_needed = false;
      if (source) {
        metrics_.wakeup(*source);
        drain_needed = true;
      }
      if (now >= next_sweep) {
        if (!drain_needed) metrics_.wakeup(WakeSource::kSweep);
        drain_needed = true;
        next_sweep = now + options_.sweep_interval;
      }
      if (auto due = loop_.next_retry_due(); due && *due <= now) {
        if (!drain_needed) metrics_.wakeup(WakeSource::kRetry);
        drain_needed = true;
      }
      poll_due = !drain_needed && now >= next_poll;
    } catch (const StoreUnavailable& e) {
      health_.store_up = false;
      ++failures;
      const auto delay = backoff_delay(options_.reconnect, failures, jitter01_());
      log::warn("database unavailable, will retry",
                {{"error", e.what()}, {"attempt", failures}, {"retry_in_ms", delay.count()}});
      if (!bell_.sleep_until(Steady::now() + delay)) break;
      drain_needed = true;
    }
  }
  try {
    loop_.flush_pending();  // outcomes a poll left for the next one
  } catch (const StoreUnavailable& e) {
    log::warn("could not write the last outcomes at shutdown; their leases expire and the events are sent again",
              {{"error", e.what()}});
  }
  health_.loop_running = false;
}

}  // namespace outbox
