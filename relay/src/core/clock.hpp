#pragma once
#include <chrono>
#include <cstdint>

namespace outbox {

// Time comes through this seam so tests never read the real clock.
class Clock {
 public:
  using SteadyTime = std::chrono::steady_clock::time_point;
  virtual ~Clock() = default;
  virtual SteadyTime now() const = 0;
  // Microseconds since the Unix epoch (wall clock), for commit-to-ack latency.
  virtual std::int64_t wall_us() const = 0;
};

class SystemClock final : public Clock {
 public:
  SteadyTime now() const override { return std::chrono::steady_clock::now(); }
  std::int64_t wall_us() const override {
    return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::system_clock::now().time_since_epoch())
        .count();
  }
};

}  // namespace outbox
