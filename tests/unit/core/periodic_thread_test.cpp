// The sinks' background thread (core/periodic_thread.hpp): ticks until stopped, never after.
#include <doctest/doctest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>

#include "core/periodic_thread.hpp"

using namespace outbox;
using std::chrono::milliseconds;

TEST_CASE("periodic thread: ticks every interval until stop(), and never after it") {
  std::mutex mutex;
  std::condition_variable ticked;
  int ticks = 0;
  PeriodicThread thread;
  thread.start(milliseconds{1}, [&] {
    std::lock_guard lock(mutex);
    ++ticks;
    ticked.notify_all();
  });
  {
    std::unique_lock lock(mutex);
    CHECK(ticked.wait_for(lock, std::chrono::seconds{10}, [&] { return ticks >= 3; }));
  }
  thread.stop();
  int after_stop = 0;
  {
    std::lock_guard lock(mutex);
    after_stop = ticks;
  }
  thread.stop();  // idempotent
  std::lock_guard lock(mutex);
  CHECK(ticks == after_stop);
}

TEST_CASE("periodic thread: stop() does not wait out a long interval; one never started stops at once") {
  std::atomic<int> ticks{0};
  const auto begun = std::chrono::steady_clock::now();
  {
    PeriodicThread thread;
    thread.start(milliseconds{3'600'000}, [&] { ++ticks; });
  }  // the destructor stops it
  CHECK(std::chrono::steady_clock::now() - begun < std::chrono::seconds{10});
  CHECK(ticks == 0);
  PeriodicThread never_started;
  never_started.stop();
}

TEST_CASE("periodic thread: start() twice is a logic error") {
  PeriodicThread thread;
  thread.start(milliseconds{3'600'000}, [] {});
  CHECK_THROWS_AS(thread.start(milliseconds{1}, [] {}), std::logic_error);
}
