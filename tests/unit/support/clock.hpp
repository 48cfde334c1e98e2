#pragma once
// Test support: a clock that moves only when a test moves it.
#include <chrono>
#include <cstdint>

#include "core/clock.hpp"

namespace outbox::testing {

class FakeClock final : public Clock {
 public:
  SteadyTime now() const override { return t; }
  std::int64_t wall_us() const override { return wall; }

  SteadyTime t{};                 // steady time: starts at the epoch of steady_clock
  std::int64_t wall = 1'000'000;  // wall clock, microseconds since the Unix epoch
};

}  // namespace outbox::testing
