#pragma once
// The reconnect loop of a database session, in one place for the work session (Runner) and the
// LISTEN session (pg::Listener): run the session, and after a failure mark it down, count and log
// the failure by class, wait the backoff, and run it again.
#include <atomic>
#include <functional>
#include <string>

#include "core/backoff.hpp"
#include "core/bell.hpp"
#include "core/clock.hpp"
#include "core/db_error.hpp"
#include "core/metrics.hpp"

namespace outbox {

// The log lines of one session ("database unavailable, will retry" / "database session restored").
struct SessionTexts {
  const char* session;   // the "session" field: "worker", "listener"
  const char* lost;      // warn, after a failure that a reconnect may cure
  const char* restored;  // info, once the session works again after failures
};

class Reconnect {
 public:
  // up and error: the session's Health facts. Everything is borrowed. Called from one thread.
  Reconnect(SessionTexts texts, BackoffPolicy policy, Waiter& waiter, const Clock& clock, Metrics& metrics,
            std::atomic<bool>& up, std::atomic<DbErrorClass>& error, std::function<double()> jitter01);

  // Runs session() until the waiter stops. session() connects, calls connected() once its session
  // works, and returns when the waiter stops or throws StoreUnavailable. After a failure: the
  // session is marked down with its class, outbox_relay_db_errors_total{class} counts it, the
  // failure is logged and session() runs again after the backoff:
  // - transient / other: warn, exponential backoff with jitter (policy.initial doubling to max);
  // - a class that needs an operator: error with the hint, and the backoff at its cap at once (a
  //   fix takes a person, not a retry; the relay stays up and recovers by itself after the fix).
  // Other exceptions propagate.
  void run(const std::function<void()>& session);

  // Marks the session up. After failures, logs `restored` and counts a reconnect. Returns the
  // number of failures before (0 at the first connect).
  int connected();

  int failures() const { return failures_; }

 private:
  SessionTexts texts_;
  BackoffPolicy policy_;
  Waiter& waiter_;
  const Clock& clock_;
  Metrics& metrics_;
  std::atomic<bool>& up_;
  std::atomic<DbErrorClass>& error_;
  std::function<double()> jitter01_;
  int failures_ = 0;
};

// The delay before the next attempt after `failures` failures of this class: the cap (with
// jitter) at once for a class that needs an operator. Pure.
std::chrono::milliseconds reconnect_delay(const BackoffPolicy& policy, int failures, DbErrorClass kind,
                                          double jitter01);

}  // namespace outbox
