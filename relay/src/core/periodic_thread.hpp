#pragma once
// One thread that runs a task every interval until its owner stops it: the sinks' work between
// batches (Kafka's idle poll, the Redis PING, the RabbitMQ keeper). HelperThread (helper_thread.hpp)
// is the other kind: one task at a time, on demand.
//
// Threading: tick runs on the thread, never twice at once, the first time one interval after
// start(). It takes whatever locks it needs itself; stop() holds no lock of the owner's, so a tick
// may wait for the owner's mutex. A tick that throws ends the process (as any std::thread's).
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>

namespace outbox {

class PeriodicThread {
 public:
  PeriodicThread() = default;
  // stop().
  ~PeriodicThread();
  PeriodicThread(const PeriodicThread&) = delete;
  PeriodicThread& operator=(const PeriodicThread&) = delete;

  // Starts the thread. Once only. Lifetime: what tick uses must outlive stop() (or this object).
  void start(std::chrono::milliseconds interval, std::function<void()> tick);
  // Wakes the thread, lets a tick in progress end, and joins it; no tick runs after it returns.
  // Idempotent. An owner whose tick uses its other members calls it first in its destructor.
  void stop();

 private:
  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;  // under mutex_
  std::thread thread_;
};

}  // namespace outbox
