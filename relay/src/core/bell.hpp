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
};

class Bell final : public Waiter {
 public:
  // Thread-safe.
  void ring(WakeSource source);
  // Asks the loop to stop; wakes every waiter. Thread-safe.
  void stop();
  bool stopped() const override;

  std::optional<WakeSource> wait_until(std::chrono::steady_clock::time_point deadline) override;
  bool sleep_until(std::chrono::steady_clock::time_point deadline) override;
  void clear() override;

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<WakeSource> rung_;
  bool stopped_ = false;
};

}  // namespace outbox
