#pragma once
// The wakeup bell between the LISTEN thread, the signal thread and the loop thread.
// Level-triggered: a ring while the loop is busy is kept and wakes the next wait at once.
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>

#include "core/metrics.hpp"

namespace outbox {

class Bell {
 public:
  // Thread-safe.
  void ring(WakeSource source);
  // Asks the loop to stop; wakes every waiter. Thread-safe.
  void stop();
  bool stopped() const;

  // Blocks until rung, stopped or deadline. Returns the ring's source and clears it; nullopt on
  // timeout or stop.
  std::optional<WakeSource> wait_until(std::chrono::steady_clock::time_point deadline);
  // Sleeps until deadline or stop, ignoring rings (which stay set). Returns false if stopped.
  bool sleep_until(std::chrono::steady_clock::time_point deadline);
  // Clears a pending ring without waiting: called right before a drain starts.
  void clear();

 private:
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::optional<WakeSource> rung_;
  bool stopped_ = false;
};

}  // namespace outbox
