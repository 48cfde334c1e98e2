// PgStore's claim state (postgres/claim_state.hpp) driven directly, one schema path at a time:
// what a claim sends, what a poll asks first, when a watch or a sweep range is offered.
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
const ClaimFunctions kSchema1{false, false, false};
const ClaimFunctions kSchema2{true, false, false};
const ClaimFunctions kSchema3{true, true, false};
const ClaimFunctions kSchema5{true, true, true};

// A state at `schema`, found on a new session, owning `owned`.
ClaimState at(const ClaimFunctions& schema, LaneMask owned = kAll) {
  ClaimState s;
  s.use(schema, s.compare(schema, true));
  s.set_owned(owned);
  return s;
}

using outbox::testing::all_lanes;

}  // namespace

TEST_CASE("claim state: a look at the schema says what to prepare") {
  ClaimState s;
  CHECK_FALSE(s.compare(kSchema1, true).prepare);  // schema 1: nothing to prepare, nothing new
  CHECK_FALSE(s.compare(kSchema1, true).changed);
  s.use(kSchema1, s.compare(kSchema1, true));
  CHECK_FALSE(s.by_function());

  // The claim function appears (a `migrate` beside a running relay): prepared on this session.
  const auto seen = s.compare(kSchema2, false);
  CHECK(seen.prepare);
  CHECK(seen.changed);
  s.use(kSchema2, seen);
  CHECK(s.by_function());
  CHECK_FALSE(s.functions().floor);
  CHECK_FALSE(s.by_lanes());

  CHECK_FALSE(s.compare(kSchema2, false).prepare);  // the same again: nothing to do
  CHECK_FALSE(s.compare(kSchema2, false).changed);
  CHECK(s.compare(kSchema2, true).prepare);  // a new session prepares what it uses
  CHECK(s.compare(kSchema3, false).changed);
  CHECK(s.compare(kSchema5, false).changed);
  CHECK_FALSE(s.compare(ClaimFunctions{false, true, true}, true).prepare);  // no plain function: schema 1's path
}

TEST_CASE("claim state: the lane bounds start afresh when lane statements are prepared") {
  ClaimState s = at(kSchema5);
  s.writers_read(kT0, {100, {}});
  CHECK(s.lanes().resolved() == 100);
  s.use(kSchema5, s.compare(kSchema5, false));  // unchanged: kept
  CHECK(s.lanes().resolved() == 100);
  s.use(kSchema5, s.compare(kSchema5, true));  // a new session: afresh
  CHECK(s.lanes().resolved() == -1);
}

TEST_CASE("claim state: schema 1 claims up to the lowest fence, and is fenced below an open writer") {
  ClaimState s = at(kSchema1);
  CHECK(s.poll_in_two_steps());
  CHECK(ClaimState::statement_bound(120, 100) == 100);
  CHECK(ClaimState::statement_bound(120, 9'223'372'036'854'775'807) == 120);  // no writer open

  s.statements_claimed(500, 3, 120, 100);  // a writer's fence at 100, ids drawn up to 120
  CHECK(s.fenced());
  s.statements_claimed(500, 500, 120, 100);  // a full batch: claim again at once, not a poll
  CHECK_FALSE(s.fenced());
  s.statements_claimed(500, 3, 120, 130);  // the fence is above every id drawn
  CHECK_FALSE(s.fenced());

  // Schema 1 offers no watch, no sweep range, no reading.
  CHECK_FALSE(s.watch_from(true));
  CHECK_FALSE(s.sweep_upto(true));
  CHECK_FALSE(s.reading_pending());
  CHECK_FALSE(s.ask_anything_new_first(true, false));
}

TEST_CASE("claim state: schema 2 and 3 poll the claim function, then ask 'anything new?' while quiet") {
  for (const auto& schema : {kSchema2, kSchema3}) {
    CAPTURE(schema.floor);
    ClaimState s = at(schema);
    CHECK_FALSE(s.poll_in_two_steps());
    CHECK(s.resolved() == -1);
    CHECK(s.reading_last() == -1);
    CHECK(s.reading_holders() == "{}");
    CHECK_FALSE(s.ask_anything_new_first(true, false));  // nothing resolved yet: the function first

    s.function_claimed(false, 500, 7, 100, 100, std::nullopt, "");  // a drain's claim
    CHECK(s.resolved() == 100);
    CHECK_FALSE(s.quiet());  // not a poll
    CHECK_FALSE(s.fenced());
    CHECK_FALSE(s.watch_from(true));
    CHECK(s.sweep_upto(true) == 100);
    CHECK_FALSE(s.sweep_upto(false));  // no session

    s.function_claimed(true, 500, 0, 100, 100, std::nullopt, "");  // a poll that found nothing
    CHECK(s.quiet());
    CHECK(s.floor_id() == 100);
    CHECK(s.ask_anything_new_first(true, false));
    CHECK_FALSE(s.ask_anything_new_first(true, true));    // outcomes to write: the function carries them
    CHECK_FALSE(s.ask_anything_new_first(false, false));  // a claim, not a poll
    CHECK(s.watch_from(true) == 100);
    CHECK_FALSE(s.watch_from(false));

    s.function_claimed(true, 500, 2, 90, 100, std::nullopt, "");  // a lower bound never lowers resolved
    CHECK(s.resolved() == 100);
    CHECK_FALSE(s.quiet());  // it found events
    CHECK_FALSE(s.ask_anything_new_first(true, false));
  }
}

TEST_CASE("claim state: schema 2 keeps the function's reading of open writers until it resolves") {
  ClaimState s = at(kSchema2);
  // An open writer drew ids 101..120; the function resolved up to 100 and read the writers.
  s.function_claimed(true, 500, 0, 100, 120, 120, "{3/7}");
  CHECK(s.fenced());  // held back below the last id: poll again soon
  CHECK(s.quiet());
  CHECK(s.reading_pending());
  CHECK(s.reading_last() == 120);
  CHECK(s.reading_holders() == "{3/7}");
  CHECK_FALSE(s.watch_from(true));               // fenced: no watch, the runner polls
  CHECK(s.ask_anything_new_first(true, false));  // quiet with resolved known: the probe asks above 100

  // The writer committed: the next call resolves past its ids and drops the reading.
  s.function_claimed(true, 500, 20, 120, 120, std::nullopt, "");
  CHECK(s.resolved() == 120);
  CHECK_FALSE(s.fenced());
  CHECK_FALSE(s.reading_pending());
  CHECK(s.reading_last() == -1);
  CHECK(s.reading_holders() == "{3/7}");  // kept, and sent with reading_last -1 (ignored then)

  // A full batch below the last id is not fenced: the drain claims again at once.
  s.function_claimed(false, 500, 500, 600, 900, std::nullopt, "");
  CHECK_FALSE(s.fenced());
}

TEST_CASE("claim state: a watch waits above the pending reading's last id") {
  ClaimState s = at(kSchema2);
  // Quiet, not held back, and a reading whose last id is above resolved (not yet checked).
  s.function_claimed(true, 500, 0, 100, 100, 104, "{3/7}");
  CHECK_FALSE(s.fenced());
  CHECK(s.watch_from(true) == 104);
}

TEST_CASE("claim state: lanes gained and a lost session make the next claim look from the start") {
  ClaimState s = at(kSchema2);
  s.function_claimed(true, 500, 0, 100, 120, 120, "{3/7}");
  s.lanes_gained();
  CHECK(s.resolved() == -1);
  CHECK(s.reading_last() == 120);  // the reading stays: its writers may still be open
  CHECK_FALSE(s.ask_anything_new_first(true, false));
  CHECK_FALSE(s.watch_from(true));
  CHECK_FALSE(s.sweep_upto(true));

  s.function_claimed(true, 500, 0, 100, 100, std::nullopt, "");
  CHECK(s.watch_from(true) == 100);
  s.session_lost();
  CHECK(s.owned() == 0);
  CHECK(s.poll_in_two_steps());
  CHECK(s.resolved() == -1);
  CHECK(s.reading_last() == -1);
  CHECK_FALSE(s.reading_pending());
  CHECK(s.quiet());  // kept, but with resolved unknown nothing relies on it
  CHECK_FALSE(s.ask_anything_new_first(true, false));
  CHECK_FALSE(s.watch_from(true));
}

TEST_CASE("claim state: no lanes owned, no watch (its drains would claim nothing, again and again)") {
  ClaimState s = at(kSchema2, 0);
  CHECK(s.poll_in_two_steps());
  s.function_claimed(true, 500, 0, 100, 100, std::nullopt, "");
  CHECK_FALSE(s.watch_from(true));
  CHECK(s.sweep_upto(true) == 100);
}

TEST_CASE("claim state: schema 5 reads the writers first, then claims lane by lane") {
  const LaneMask owned = lane_bit(0) | lane_bit(1) | lane_bit(2);
  ClaimState s = at(kSchema5, owned);
  CHECK(s.by_lanes());
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

TEST_CASE("claim state: schema 5 with a reading pending polls through the claim function") {
  ClaimState s = at(kSchema5);
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
  ClaimState s = at(kSchema5);
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
