#include "postgres/notify_pacer.hpp"

#include <doctest/doctest.h>

using outbox::pg::NotifyPacer;
using std::chrono::milliseconds;

TEST_CASE("the first notification after a quiet interval rings at once; a flood rings once per interval") {
  NotifyPacer pacer(milliseconds(100));
  const NotifyPacer::Time t0{};
  CHECK(pacer.arrived(t0 + milliseconds(1000)));  // an operator's command: no added latency
  CHECK_FALSE(pacer.due().has_value());

  // 10,000 a second for 1 s: one ring at its start, then one per 100 ms.
  int rings = 0;
  for (int us = 100; us <= 1'000'000; us += 100) {
    const auto now = t0 + milliseconds(1000) + std::chrono::microseconds(us);
    if (pacer.take_due(now)) ++rings;
    if (pacer.arrived(now)) ++rings;
  }
  CHECK(rings == 10);
  // The last ones are held, not lost: one more ring when the interval has passed.
  REQUIRE(pacer.due().has_value());
  CHECK_FALSE(pacer.take_due(*pacer.due() - milliseconds(1)));
  CHECK(pacer.take_due(*pacer.due()));
  CHECK_FALSE(pacer.due().has_value());
  CHECK_FALSE(pacer.take_due(t0 + milliseconds(5000)));  // nothing held, nothing due

  // Quiet again: the next one rings at once.
  CHECK(pacer.arrived(t0 + milliseconds(6000)));
}
