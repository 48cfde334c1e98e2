// PgStore's claim state (postgres/claim_state.hpp) driven directly: what a claim sends, what a
// poll asks first, when a watch or a sweep range is offered.
#include <doctest/doctest.h>

#include <chrono>

#include "postgres/claim_state.hpp"
#include "support/lanes.hpp"

using namespace outbox;
using namespace outbox::pg;
using namespace std::chrono_literals;

namespace {

constexpr LaneMask kAll = ~LaneMask{0};
const ClaimState::Time kT0{};

// A state owning `owned`, as on a new session.
ClaimState at(LaneMask owned = kAll) {
  ClaimState s;
  s.set_owned(owned);
  return s;
}

using outbox::testing::all_lanes;

}  // namespace

TEST_CASE("claim state: no lanes owned, no watch (its drains would claim nothing, again and again)") {
  ClaimState s = at(0);
  s.writers_read(kT0, {100, {}});
  s.lanes_claimed(kT0, true, 500, 0, all_lanes(100), 100);
  CHECK_FALSE(s.watch_from(true));
  CHECK_FALSE(s.reading_due(kT0));
}

TEST_CASE("claim state: the writers are read first, then claims go lane by lane") {
  const LaneMask owned = lane_bit(0) | lane_bit(1) | lane_bit(2);
  ClaimState s = at(owned);
  CHECK(s.reading_due(kT0));  // nothing known: read first
  CHECK(s.floor_id() == -1);
  s.writers_read(kT0, {100, {}});  // nobody open: every lane resolved up to 100
  CHECK(s.floor_id() == 100);
  CHECK_FALSE(s.reading_due(kT0 + 1ms));

  CHECK(s.lanes_claimed(kT0, true, 500, 0, all_lanes(100), 100) == 0);
  CHECK(s.resolved() == 100);
  CHECK(s.quiet());
  CHECK_FALSE(s.fenced());
  CHECK(s.ask_anything_new_first(true, false));
  CHECK(s.watch_from(true) == 100);
  CHECK(s.sweep_upto(true) == 100);

  // A poll that returned at once: the bounds stay, a new last id shows every lane held.
  CHECK(s.lanes_claimed(kT0 + 1ms, true, 500, 0, std::nullopt, 110) == owned);
  CHECK(s.fenced());
  CHECK_FALSE(s.quiet());
  CHECK_FALSE(s.watch_from(true));

  // Lane 1 is held at 105 by a writer; lanes 0 and 2 reached 110; lane 5 (not ours) is ignored.
  LaneIds bounds = all_lanes(110);
  bounds[1] = 105;
  bounds[5] = 200;
  CHECK(s.lanes_claimed(kT0 + 2ms, true, 500, 4, bounds, 110) == lane_bit(1));
  CHECK(s.held() == lane_bit(1));
  CHECK(s.fenced());
  CHECK(s.resolved() == 105);        // the lowest owned lane
  CHECK(s.sweep_upto(true) == 110);  // polls look above each lane's bound
  CHECK_FALSE(s.lanes().uniform());

  // A full claim is not fenced, even with a lane held: the drain claims again at once.
  s.lanes_claimed(kT0 + 3ms, false, 4, 4, bounds, 110);
  CHECK_FALSE(s.fenced());
}

TEST_CASE("claim state: with a reading pending a poll goes through the claim") {
  ClaimState s = at();
  s.writers_read(kT0, {100, {}});
  s.lanes_claimed(kT0, true, 500, 0, all_lanes(100), 100);
  CHECK(s.ask_anything_new_first(true, false));
  OpenWriter w;
  w.vxid = "3/7";
  w.complete = false;  // its lanes are unknown: it holds every lane until it ends
  s.writers_read(kT0 + 30ms, {120, {w}});
  CHECK(s.reading_pending());
  CHECK_FALSE(s.ask_anything_new_first(true, false));  // the function checks the pending reading
  CHECK(s.watch_from(true) == 120);                    // the pending reading's last id
  s.writers_read(kT0 + 60ms, {120, {}});               // it ended
  CHECK_FALSE(s.reading_pending());
  CHECK(s.lanes().resolved() == 120);
}

TEST_CASE("claim state: lanes gained uncover every lane; a lost session forgets them") {
  ClaimState s = at();
  s.writers_read(kT0, {100, {}});
  s.lanes_claimed(kT0, true, 500, 0, all_lanes(100), 100);
  s.lanes_gained();
  CHECK(s.resolved() == -1);
  CHECK(s.lanes().covered()[0] == -1);
  CHECK(s.lanes().resolved() == 100);  // what is resolved stays known
  CHECK(s.floor_id() == 100);
  CHECK(s.lanes().covered()[63] == -1);  // the claim sends per-lane bounds: each lane from the start
  CHECK_FALSE(s.lanes().uniform());
  CHECK_FALSE(s.watch_from(true));  // resolved unknown until the next claim
  CHECK_FALSE(s.sweep_upto(true));
  s.session_lost();
  CHECK(s.lanes().resolved() == -1);
  CHECK(s.floor_id() == -1);
  CHECK(s.reading_due(kT0) == false);  // no lanes owned
  s.set_owned(kAll);
  CHECK(s.reading_due(kT0));
}
