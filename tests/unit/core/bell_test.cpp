// The idle watch's hand-over in the real Bell (core/bell.hpp): offers, rings, and the eventfd a
// watcher polls.
#include <doctest/doctest.h>
#include <poll.h>

#include "core/bell.hpp"

using namespace outbox;

namespace {

bool readable(const Bell& bell) {
  pollfd p{bell.watcher_fd(), POLLIN, 0};
  return ::poll(&p, 1, 0) == 1;
}

std::optional<WakeSource> take(Bell& bell) { return bell.wait_until(std::chrono::steady_clock::now()); }

}  // namespace

TEST_CASE("bell: no watcher, no watch; a watcher takes offers and is woken by new ones only") {
  Bell bell;
  CHECK_FALSE(bell.offer_watch(10));
  CHECK_FALSE(bell.watch_offer().has_value());
  CHECK_FALSE(readable(bell));

  bell.set_watcher(true);
  CHECK(bell.offer_watch(10));
  CHECK(bell.watch_offer() == 10);
  CHECK(readable(bell));
  bell.drain_watcher_fd();
  CHECK_FALSE(readable(bell));
  CHECK(bell.offer_watch(10));  // the same offer again: the watcher has it, nothing to wake
  CHECK_FALSE(readable(bell));
  CHECK(bell.offer_watch(12));
  CHECK(readable(bell));

  bell.set_watcher(false);  // its session ended
  CHECK_FALSE(bell.watch_offer().has_value());
  CHECK_FALSE(bell.offer_watch(12));
}

TEST_CASE("bell: a watch rings kWatch once, and only for the offer still in force") {
  Bell bell;
  bell.set_watcher(true);
  REQUIRE(bell.offer_watch(10));
  bell.ring_watch(9);  // a statement for an older offer
  CHECK_FALSE(take(bell).has_value());
  bell.ring_watch(10);
  CHECK(take(bell) == WakeSource::kWatch);
  CHECK_FALSE(bell.watch_offer().has_value());  // ended by the ring
  bell.ring_watch(10);
  CHECK_FALSE(take(bell).has_value());

  REQUIRE(bell.offer_watch(20));
  bell.withdraw_watch();  // the loop moved on before the watch saw an id
  bell.ring_watch(20);
  CHECK_FALSE(take(bell).has_value());

  REQUIRE(bell.offer_watch(30));
  bell.ring(WakeSource::kNotify);  // a ring already waiting keeps its source
  bell.ring_watch(30);
  CHECK(take(bell) == WakeSource::kNotify);
}

TEST_CASE("bell: stop wakes the watcher") {
  Bell bell;
  CHECK_FALSE(readable(bell));
  bell.stop();
  CHECK(readable(bell));
  CHECK(bell.stopped());
}
