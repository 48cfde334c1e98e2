#pragma once
// The LISTEN session's watch decision (postgres/listener.hpp): when to look at the table again,
// whether to watch the id sequence for the loop's offer or wait for a NOTIFY only, when to say
// why there is no watch, and what one watch statement runs. A pure state machine, one per
// session: no I/O, time comes in as arguments; the listener feeds it what it looked up and what
// a watch statement returned.
#include <chrono>
#include <optional>
#include <string>

#include "core/clock.hpp"

namespace outbox::pg {

// One watch statement: `checks` reads of the sequence, `check_seconds` apart (at least one sleep
// per statement, whatever the two durations).
struct WatchStatement {
  int checks = 2;
  double check_seconds = 0;
};
WatchStatement watch_statement(std::chrono::milliseconds check, std::chrono::milliseconds length);

class IdleWatch {
 public:
  using Time = Clock::SteadyTime;
  // How often a session that may not watch looks at the table again (a migration that drops the
  // NOTIFY trigger, a grant, a push trigger created or dropped).
  static constexpr std::chrono::seconds kLookAgain{60};

  // enabled: relay.idle_watch; off, the session only listens and never looks.
  explicit IdleWatch(bool enabled) : enabled_(enabled) {}

  // Whether to look at the table now: at the session's start, then every kLookAgain.
  bool look_due(Time now) const { return enabled_ && (!looked_at_ || now - *looked_at_ >= kLookAgain); }
  // What the look found: the sequence to watch, or none (the table's writers notify, no
  // privilege, no table, an error). Returns whether to say why there is none: once, and again
  // after a change.
  bool looked(Time now, std::optional<std::string> sequence);
  // A sequence to watch (the bell's watcher: the loop may offer a watch).
  bool watching() const { return sequence_.has_value(); }
  const std::optional<std::string>& sequence() const { return sequence_; }
  // What to do with the loop's offer (Bell::watch_offer, asked only while watching): the id to
  // watch above, or nullopt: wait for a NOTIFY (or the bell).
  std::optional<long long> watch_above(const std::optional<long long>& offer) const {
    return sequence_ ? offer : std::nullopt;
  }
  // A watch statement failed while the session is fine: listen only until the next look.
  void watch_failed() { sequence_.reset(); }
  // A watch statement that returned `last` for an offer above `after`: ring kWatch.
  static bool new_id(long long last, long long after) { return last > after; }

 private:
  bool enabled_;
  std::optional<std::string> sequence_;
  std::optional<Time> looked_at_;
};

}  // namespace outbox::pg
