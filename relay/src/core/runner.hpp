#pragma once
// Drives the loop: polls the store (Store::probe_claim) every poll_interval while events flow and
// every idle_poll_interval once they stop, or hands the wait for new events to the LISTEN thread
// (Waiter::offer_watch) and polls every watched_poll_interval; drains at once on a bell (LISTEN,
// the watch), a sweep tick, a due retry or lanes gained, until a claim comes back short;
// reconnects with backoff (core/reconnect) when the store fails. docs/design.md "How wakeups
// work".
//
// Time and waiting come through the Clock and Waiter seams (the Bell in production), so unit tests
// drive the schedule on one thread with a fake clock and no sleeps.
#include <chrono>
#include <functional>
#include <mutex>
#include <optional>
#include <vector>

#include "core/backoff.hpp"
#include "core/bell.hpp"
#include "core/clock.hpp"
#include "core/health.hpp"
#include "core/loop.hpp"
#include "core/reconnect.hpp"

namespace outbox {

// No defaults here: config/config.hpp holds them, app/options.hpp builds these from a Config.
struct RunnerOptions {
  std::chrono::milliseconds sweep_interval;
  std::chrono::milliseconds rebalance_interval;
  // Polls while events flow, or while a claim is held back by an open writer (whose commit or
  // rollback rings nothing): events wait up to this long, and a steady stream is claimed in
  // batches of what arrived meanwhile.
  std::chrono::milliseconds poll_interval;
  // A light stream (fewer than light_poll_events per poll_interval) is polled less often, up to
  // this far apart, so that a poll carries about light_poll_events events: each poll costs a round
  // trip, a statement and a sink request whatever it carries. Equal to poll_interval: off.
  std::chrono::milliseconds light_poll_interval;
  int light_poll_events;
  // Once nothing new was found for idle_after, the interval grows to idle_poll_interval: what an
  // idle relay costs.
  std::chrono::milliseconds idle_poll_interval;
  std::chrono::milliseconds idle_after;
  // Idle, with the LISTEN session watching the id sequence for the relay (Waiter::offer_watch:
  // a new id rings at once), polls are only a safety net, this far apart.
  std::chrono::milliseconds watched_poll_interval;
  BackoffPolicy reconnect;
};

// A reloaded config's part of the loop and the runner (app/reload.hpp): posted from another
// thread, taken by the runner at a safe point (Runner::post).
struct Reconfiguration {
  std::vector<Sink*> sinks;
  const Router* router = nullptr;  // never null when posted
  LoopOptions loop;
  // Its reconnect backoff is not taken: the runner's reconnect keeps the one it started with.
  RunnerOptions runner;
};

class Runner {
 public:
  // Everything is borrowed and must outlive the runner. jitter01 returns uniform numbers in [0, 1).
  Runner(RelayLoop& loop, Store& store, Waiter& waiter, const Clock& clock, Metrics& metrics, Health& health,
         RunnerOptions options, std::function<double()> jitter01);

  // Runs on the calling thread until the waiter stops. The batch in flight when stop arrives is
  // finished and completed before this returns. Never throws StoreUnavailable.
  void run();

  // Thread-safe. Hands a reconfiguration to the loop thread, which takes it at its next safe
  // point (nothing in flight, every sink's acks in and their outcomes written): between drains,
  // between two batches of a long drain (DrainControl::pause), or before it connects. The
  // sinks and the router must stay alive until reconfiguration_pending() is false, and the ones
  // they replace until then too. Ring the waiter afterwards so that an idle loop takes it at once.
  // One at a time: post again only once the last one was taken.
  void post(Reconfiguration next);
  // Thread-safe. Whether the last post() has not been taken yet.
  bool reconfiguration_pending() const;

 private:
  // Takes a posted reconfiguration, if any (the loop thread, at a safe point).
  void take_reconfiguration();

  using Time = Clock::SteadyTime;

  // One connected session: connects, writes what a lost session left, takes its lanes, then
  // drains and polls on schedule. Returns on stop; throws StoreUnavailable (Reconnect runs it
  // again after the backoff).
  void session();
  void after_failure();
  // Returns how many events were claimed.
  std::size_t drain(bool probe);
  // Sinks that keep progress downstream (Sink::take_over): after each successful rebalance, and
  // at once when one asks.
  bool sinks_want_takeover() const;
  void take_over_sinks(bool gained);
  void rebalance_for_sinks();
  // Tries a takeover a sink wants; sets drain_needed after one succeeded. Whether one is still wanted.
  bool takeover_pending_after_try(bool& drain_needed);
  void maybe_rebalance();
  // The interval between polls while events flow: from poll_interval for a dense stream up to
  // light_poll_interval for a light one, by the event rate polls found lately.
  std::chrono::milliseconds flowing_interval() const;
  void note_poll(std::size_t claimed, Time started, Time previous);
  // A sweep is due: a look in steps when the store knows its range (Store::sweep_upto), else a
  // full drain (returns true: drain now).
  bool start_sweep();
  // One step of the sweep in progress; returns true when it found an event to claim (drain now).
  bool sweep_step();

  RelayLoop& loop_;
  Store& store_;
  Waiter& waiter_;
  const Clock& clock_;
  Metrics& metrics_;
  Health& health_;
  RunnerOptions options_;
  Reconnect reconnect_;
  Time next_rebalance_{};
  Time next_sweep_{};
  // Retries in this instance's lanes that another instance scheduled (Store::retry_due_in): looked
  // for when the session starts, when lanes are gained, and after the drain that the last one
  // found woke; the loop tracks its own.
  bool retry_look_due_ = true;
  std::optional<Time> store_retry_due_;
  // The sweep in progress, if any: it has looked up to cursor; it ends at upto (or below the
  // loop's unwritten outcomes, whose events are in flight here). Each step looks at `width` ids,
  // doubled or halved so that a step takes about kSweepStep.
  struct Sweep {
    bool active = false;
    long long cursor = 0;
    long long upto = 0;
    long long width = 0;
  };
  Sweep sweep_;
  // Whether the metrics last showed writers holding events back (reported until they show none).
  bool holds_shown_ = false;
  bool took_over_ = false;  // a sink's takeover succeeded since the session loop last looked
  // Events polls found, and the seconds they covered, smoothed over the last few polls.
  double recent_events_ = 0;
  double recent_seconds_ = 0;
  mutable std::mutex posted_mutex_;
  std::optional<Reconfiguration> posted_;  // guarded by posted_mutex_
};

}  // namespace outbox
