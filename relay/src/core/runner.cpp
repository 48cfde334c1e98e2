#include "core/runner.hpp"

#include <algorithm>
#include <utility>

#include "log/log.hpp"

namespace outbox {
namespace {

// The sweep's steps (Runner::sweep_step): each looks at a range of ids, widened or narrowed so that
// a step takes about kSweepStep, between polls. A step's cost is the pending index's entries in
// its range (mostly those of rows delivered since the last vacuum), not the events in it.
constexpr auto kSweepStep = std::chrono::milliseconds(2);
constexpr long long kSweepFirstWidth = 10'000;
constexpr long long kSweepMinWidth = 1'000;
constexpr long long kSweepMaxWidth = 1LL << 40;

}  // namespace

Runner::Runner(RelayLoop& loop, Store& store, Waiter& waiter, const Clock& clock, Metrics& metrics, Health& health,
               RunnerOptions options, std::function<double()> jitter01)
    : loop_(loop),
      store_(store),
      waiter_(waiter),
      clock_(clock),
      metrics_(metrics),
      health_(health),
      options_(options),
      reconnect_({"worker", "database unavailable, will retry", "database session restored"}, options.reconnect, waiter,
                 clock, metrics, health.store_up, health.store_error, std::move(jitter01)) {}

void Runner::maybe_rebalance() {
  const auto now = clock_.now();
  if (now < next_rebalance_) return;
  next_rebalance_ = now + options_.rebalance_interval;
  // Lanes gained are caught up by the drain in progress or the next one.
  const bool gained = store_.rebalance();
  if (gained) retry_look_due_ = true;
  take_over_sinks(gained);
}

bool Runner::sinks_want_takeover() const {
  const auto& sinks = loop_.sinks();
  return std::any_of(sinks.begin(), sinks.end(), [](const Sink* s) { return s->wants_takeover(); });
}

void Runner::take_over_sinks(bool gained) {
  // Right after a successful rebalance, with nothing claimed or in flight (Sink::take_over).
  const bool wanted = sinks_want_takeover();
  const int owned = store_.lanes_owned();
  const std::string identity = store_.identity();
  for (Sink* sink : loop_.sinks()) {
    sink->store_identity(identity);
    const std::vector<EventId> held = sink->take_over(owned, gained);
    if (held.empty()) continue;
    sink->keep_pending(store_.still_pending(held));
  }
  if (wanted && !sinks_want_takeover()) took_over_ = true;
}

void Runner::rebalance_for_sinks() {
  if (!sinks_want_takeover()) return;
  loop_.flush_pending();
  const bool gained = store_.rebalance();
  if (gained) retry_look_due_ = true;
  take_over_sinks(gained);
}

bool Runner::takeover_pending_after_try(bool& drain_needed) {
  // Until a takeover succeeds, nothing is claimed (each claim would only be handed back: an
  // event must not pay an attempt, nor be dead-lettered, for the sink's trouble). After one
  // (here or at a rebalance), a drain from the start: the batch the sink handed back when it
  // failed lies below what the next poll would look above.
  if (sinks_want_takeover()) rebalance_for_sinks();
  if (std::exchange(took_over_, false)) drain_needed = true;
  return sinks_want_takeover();
}

void Runner::note_poll(std::size_t claimed, Time started, Time previous) {
  constexpr double kWeight = 0.25;  // of the newest poll: a rate change shows within a few polls
  const double seconds = std::chrono::duration<double>(started - previous).count();
  if (recent_seconds_ <= 0) {  // the first poll
    recent_events_ = static_cast<double>(claimed);
    recent_seconds_ = seconds;
    return;
  }
  recent_events_ += kWeight * (static_cast<double>(claimed) - recent_events_);
  recent_seconds_ += kWeight * (seconds - recent_seconds_);
}

std::chrono::milliseconds Runner::flowing_interval() const {
  const auto shortest = options_.poll_interval;
  const auto longest = std::max(shortest, options_.light_poll_interval);
  if (recent_events_ <= 0 || recent_seconds_ <= 0) return longest;
  // The wait in which light_poll_events arrive at the recent rate, within [shortest, longest].
  const auto linger = std::chrono::duration<double>(options_.light_poll_events * recent_seconds_ / recent_events_);
  if (linger >= longest) return longest;
  return std::max(shortest, std::chrono::ceil<std::chrono::milliseconds>(linger));
}

bool Runner::start_sweep() {
  const auto upto = store_.sweep_upto();
  if (!upto) {
    sweep_.active = false;
    return true;
  }
  sweep_ = {.active = true, .cursor = 0, .upto = *upto, .width = kSweepFirstWidth};
  return false;
}

bool Runner::sweep_step() {
  // Not the events whose outcomes are still to be written: they are in flight here, unleased if a
  // poll claimed them.
  long long end = sweep_.upto;
  if (const auto low = loop_.lowest_unwritten()) end = std::min(end, static_cast<long long>(*low) - 1);
  if (sweep_.cursor >= end) {
    sweep_.active = false;
    return false;
  }
  const long long to = std::min(end, sweep_.cursor + sweep_.width);
  const auto started = clock_.now();
  if (store_.first_claimable(sweep_.cursor, to)) {
    sweep_.active = false;  // the drain claims from the start
    return true;
  }
  const auto took = clock_.now() - started;
  sweep_.cursor = to;
  if (took < kSweepStep / 2) {
    sweep_.width = std::min(sweep_.width * 2, kSweepMaxWidth);
  } else if (took > kSweepStep * 2) {
    sweep_.width = std::max(sweep_.width / 2, kSweepMinWidth);
  }
  return false;
}

std::size_t Runner::drain(bool probe) {
  // A full drain clears the bell: rings from here on wake the next wait, so nothing committed
  // later is missed. A poll leaves it: a ring it did not look for (a LISTEN session restored,
  // asking for a catch-up) still gets its full drain.
  if (!probe) waiter_.clear();
  DrainControl control;
  control.probe = probe;
  // A sink that lost its downstream progress (Kafka exactly once: fenced, a fatal error) ends
  // the drain: nothing is claimed for it until a takeover succeeds (session()).
  control.stop = [this] { return waiter_.stopped() || sinks_want_takeover(); };
  // Between batches, so a long backlog does not keep lanes from new peers, nor a reload waiting.
  control.pause_due = [this] {
    return clock_.now() >= next_rebalance_ || reconfiguration_pending() || sinks_want_takeover();
  };
  control.pause = [this] {
    take_reconfiguration();
    maybe_rebalance();
    rebalance_for_sinks();
  };
  const BatchResult r = loop_.drain(control);
  if (r.retried + r.dead_lettered > 0) {
    log::debug("drain done", {{"claimed", r.claimed},
                              {"delivered", r.delivered},
                              {"released", r.released},
                              {"retried", r.retried},
                              {"dead_lettered", r.dead_lettered}});
  }
  return r.claimed;
}

void Runner::post(Reconfiguration next) {
  std::lock_guard lock(posted_mutex_);
  posted_ = std::move(next);
}

bool Runner::reconfiguration_pending() const {
  std::lock_guard lock(posted_mutex_);
  return posted_.has_value();
}

void Runner::take_reconfiguration() {
  std::lock_guard lock(posted_mutex_);
  if (!posted_) return;
  loop_.reconfigure(std::move(posted_->sinks), *posted_->router, posted_->loop);
  const auto reconnect = options_.reconnect;
  options_ = posted_->runner;
  options_.reconnect = reconnect;
  // Timers set by the old intervals come no later than the new ones say.
  const auto now = clock_.now();
  next_sweep_ = std::min(next_sweep_, now + options_.sweep_interval);
  next_rebalance_ = std::min(next_rebalance_, now + options_.rebalance_interval);
  posted_.reset();  // last: the poster reads "taken" only once nothing uses the old sinks
}

void Runner::session() {
  take_reconfiguration();  // a reload while the database was away
  store_.connect();
  // Outcomes a failed complete() left, then the lanes (a new session owns none; a poll's outcomes
  // go first, as its events carry no lease: Store::probe_claim).
  loop_.flush_pending();
  take_over_sinks(store_.rebalance());
  retry_look_due_ = true;
  store_retry_due_.reset();
  auto now = clock_.now();
  next_rebalance_ = now + options_.rebalance_interval;
  reconnect_.connected();

  bool drain_needed = true;  // catch up at start and after every reconnect
  bool poll_due = false;
  auto last_found = now;  // when a drain or poll last claimed something
  auto polled_at = now;   // when the last drain or poll started
  auto poll_every = options_.poll_interval;
  sweep_ = {};
  while (!waiter_.stopped()) {
    take_reconfiguration();  // between drains: nothing in flight
    now = clock_.now();
    if (now >= next_rebalance_) {
      loop_.flush_pending();
      const bool gained = store_.rebalance();
      if (gained) drain_needed = retry_look_due_ = true;
      take_over_sinks(gained);
      next_rebalance_ = now + options_.rebalance_interval;
    }
    const bool takeover_pending = takeover_pending_after_try(drain_needed);
    // Polls are paced from the start of the previous one, so that an event waits at most about
    // one poll_interval for the poll that claims it, whatever that poll's own work took.
    if ((drain_needed || poll_due) && !takeover_pending) {
      const auto previous_poll = polled_at;
      polled_at = clock_.now();
      const bool probe = !drain_needed;
      const std::size_t claimed = drain(probe);
      if (probe) note_poll(claimed, polled_at, previous_poll);
      if (!probe) sweep_.active = false;  // a full drain claimed from the start
      if (claimed > 0) {
        last_found = clock_.now();
        if (probe) metrics_.wakeup(WakeSource::kPoll);
      }
      if (holds_shown_ || store_.waiting_for_writers()) {
        const WriterHolds holds = store_.writer_holds();
        metrics_.writers_holding(holds.events, holds.oldest_writer_seconds);
        holds_shown_ = !holds.writers.empty();
      }
    }
    if (waiter_.stopped()) return;
    // A drain a sink ended by wanting a takeover (fenced, a fatal error): try it at once.
    if (!takeover_pending && sinks_want_takeover()) continue;

    now = clock_.now();
    const bool flowing = now - last_found < options_.idle_after || store_.waiting_for_writers() || loop_.has_pending();
    // Once events stop, the interval grows by half each poll up to idle_poll_interval (~0.4 s to
    // get there from 5 ms): a stream that pauses for a moment still finds a fast poll.
    poll_every = flowing ? flowing_interval() : std::min(options_.idle_poll_interval, poll_every + poll_every / 2);
    // Idle: the LISTEN thread waits for the next id from inside Postgres, for a fraction of what
    // polls cost; a new id rings kWatch. Polls go on, far apart, as a safety net.
    bool watched = false;
    if (!flowing && poll_every >= options_.idle_poll_interval && options_.watched_poll_interval > poll_every) {
      if (const auto from = store_.watch_from()) watched = waiter_.offer_watch(*from);
    }
    if (!watched) waiter_.withdraw_watch();
    const auto next_poll = polled_at + (watched ? options_.watched_poll_interval : poll_every);
    if (retry_look_due_) {
      retry_look_due_ = false;
      const auto in = store_.retry_due_in();
      store_retry_due_ = in ? std::optional<Time>(clock_.now() + *in + kRetrySlack) : std::nullopt;
    }
    // The sweep goes on between polls, a step per turn, without waiting.
    const bool sweep_found = sweep_.active && sweep_step();
    if (sweep_found) metrics_.wakeup(WakeSource::kSweep);
    auto deadline = std::min({next_sweep_, next_rebalance_, next_poll});
    if (sweep_found || sweep_.active) deadline = clock_.now();
    if (auto due = loop_.next_retry_due()) deadline = std::min(deadline, *due);
    if (store_retry_due_) deadline = std::min(deadline, *store_retry_due_);
    const auto source = waiter_.wait_until(deadline);
    if (waiter_.stopped()) return;
    now = clock_.now();
    drain_needed = sweep_found;
    if (source) {
      metrics_.wakeup(*source);
      drain_needed = true;
    }
    if (now >= next_sweep_) {
      // A full drain walks the pending index from its start, through the entries of every event
      // delivered since the last vacuum (hundreds of thousands at a steady stream: 100-400 ms),
      // and the events that arrive meanwhile wait. The sweep looks in short steps instead and
      // drains only when it finds an event to claim below what polls look at.
      next_sweep_ = now + options_.sweep_interval;
      if (drain_needed) {
        sweep_.active = false;
      } else if (start_sweep()) {
        metrics_.wakeup(WakeSource::kSweep);
        drain_needed = true;
      }
    }
    const auto own_retry = loop_.next_retry_due();
    const bool store_retry = store_retry_due_ && *store_retry_due_ <= now;
    if ((own_retry && *own_retry <= now) || store_retry) {
      if (!drain_needed) metrics_.wakeup(WakeSource::kRetry);
      drain_needed = true;
    }
    if (store_retry) {
      store_retry_due_.reset();
      retry_look_due_ = true;  // after this drain: the next one, if any
    }
    poll_due = !drain_needed && now >= next_poll;
    if (poll_due && watched && store_.reading_pending()) {
      // The watch sees ids drawn after the store's reading of open writers; whether those of the
      // reading committed or rolled back only a claim finds out (a poll that finds nothing new
      // returns at once): the safety poll is a claim while it is pending.
      drain_needed = true;
      poll_due = false;
    }
  }
}

void Runner::after_failure() {
  if (!store_.failed_session_open()) return;  // lost: its lanes are free, the next session writes
  try {
    loop_.flush_pending();  // the completer's session, while the failed one still holds the lanes
  } catch (const StoreUnavailable& e) {
    log::warn("could not write the outcomes before the failed session's lanes go; a peer may send their events again",
              {{"error", e.what()}});
  }
  store_.close_failed_session();
}

void Runner::run() {
  health_.loop_running = true;
  next_sweep_ = clock_.now() + options_.sweep_interval;
  reconnect_.run([this] {
    try {
      session();
    } catch (const StoreUnavailable&) {
      after_failure();
      throw;
    }
  });
  try {
    loop_.flush_pending();  // outcomes a poll left for the next one
  } catch (const StoreUnavailable& e) {
    log::warn("could not write the last outcomes at shutdown; their leases expire and the events are sent again",
              {{"error", e.what()}});
  }
  health_.loop_running = false;
}

}  // namespace outbox
