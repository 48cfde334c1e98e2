#pragma once
// The wakeup bell between the LISTEN thread, the signal thread and the loop thread.
// Level-triggered: a ring while the loop is busy is kept and wakes the next wait at once.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "core/metrics.hpp"

namespace outbox {

// How the runner and the reconnect loop wait: the Bell in production; in unit tests a fake that
// moves a fake Clock to the deadline instead of sleeping. Deadlines are on the Clock's timeline.
class Waiter {
 public:
  virtual ~Waiter() = default;
  virtual bool stopped() const = 0;
  // Blocks until rung, stopped or deadline. Returns the ring's source and clears it; nullopt on
  // timeout or stop.
  virtual std::optional<WakeSource> wait_until(std::chrono::steady_clock::time_point deadline) = 0;
  // Sleeps until deadline or stop, ignoring rings (which stay set). Returns false if stopped.
  virtual bool sleep_until(std::chrono::steady_clock::time_point deadline) = 0;
  // Clears a pending ring without waiting: called right before a drain starts.
  virtual void clear() = 0;
  // The idle watch: an idle loop asks for a kWatch ring once an id above `after` is drawn from the
  // table's id sequence (the LISTEN thread watches it from inside Postgres, which costs less than
  // polling the table). False if nothing can watch now: the loop keeps polling.
  virtual bool offer_watch(long long /*after*/) { return false; }
  // The loop is no longer idle: no kWatch ring for an earlier offer.
  virtual void withdraw_watch() {}
};

class Bell final : public Waiter {
 public:
  Bell();
  ~Bell() override;
  Bell(const Bell&) = delete;
  Bell& operator=(const Bell&) = delete;

  // Thread-safe.
  void ring(WakeSource source);
  // Asks the loop to stop; wakes every waiter. Thread-safe.
  void stop();
  bool stopped() const override;

  std::optional<WakeSource> wait_until(std::chrono::steady_clock::time_point deadline) override;
  bool sleep_until(std::chrono::steady_clock::time_point deadline) override;
  void clear() override;

  // The loop's side of the idle watch (thread-safe).
  bool offer_watch(long long after) override;
  void withdraw_watch() override;
  // The watcher's side (the LISTEN thread). While set_watcher(true), offers are taken.
  void set_watcher(bool available);
  // The id the loop waits for ids above, if it does.
  std::optional<long long> watch_offer() const;
  // Rings kWatch and ends the offer if `after` is still the offer (the loop may have moved on).
  void ring_watch(long long after);
  // Readable (an eventfd) when an offer is made or the bell stops; a watcher polls it beside its
  // connection's socket and calls drain_watcher_fd() before it looks at the offer again.
  int watcher_fd() const { return fd_; }
  void drain_watcher_fd();

 private:
  void signal_watcher();

  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<WakeSource> rung_;
  bool stopped_ = false;
  bool watcher_ = false;
  std::optional<long long> watch_after_;
  int fd_ = -1;
};

}  // namespace outbox
