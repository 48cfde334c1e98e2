// What is resolved lane by lane, and when the writers are read (postgres/lane_bounds.hpp): the state
// machine driven directly, time passed in.
#include <doctest/doctest.h>

#include <chrono>
#include <string>

#include "postgres/lane_bounds.hpp"
#include "support/lanes.hpp"

using namespace outbox;
using namespace outbox::pg;
using namespace std::chrono_literals;

namespace {

using Time = LaneBounds::Time;
const Time kT0{};
constexpr LaneMask kAll = ~LaneMask{0};
const ReadingPace kPace{10ms, 10ms, 100ms};

OpenWriter writer(const std::string& vxid, bool complete, LaneMask lanes) {
  OpenWriter w;
  w.vxid = vxid;
  w.complete = complete;
  w.lanes = lanes;
  return w;
}

using outbox::testing::all_lanes;

}  // namespace

TEST_CASE("lane bounds: nothing is known until the first reading, which must come first") {
  LaneBounds b{kPace};
  b.set_owned(kAll);
  CHECK(b.resolved() == -1);
  CHECK(b.reading_due(kT0, kAll));
  CHECK_FALSE(b.reading_due(kT0, 0));  // no lanes: nothing to claim
  b.read(kT0, {100, {}});              // nobody open: every id up to 100 is committed or gone
  CHECK(b.resolved() == 100);
  CHECK(b.known()[0] == 100);
  CHECK(b.known()[63] == 100);
  CHECK_FALSE(b.reading_due(kT0 + 1ms, kAll));
}

TEST_CASE("lane bounds: a complete writer holds only the lanes it marked") {
  LaneBounds b{kPace};
  b.set_owned(kAll);
  b.read(kT0, {100, {writer("3/7", true, lane_bit(5) | lane_bit(9))}});
  CHECK(b.resolved() == -1);  // lanes 5 and 9 know nothing yet
  CHECK(b.known()[5] == -1);
  CHECK(b.known()[9] == -1);
  CHECK(b.known()[4] == 100);
  CHECK(b.known()[10] == 100);
  CHECK_FALSE(b.reading_pending());
}

TEST_CASE("lane bounds: a writer whose lanes are unknown holds every lane until it ends") {
  LaneBounds b{kPace};
  b.set_owned(kAll);
  b.read(kT0, {100, {writer("3/7", false, lane_bit(5)), writer("4/2", true, lane_bit(9))}});
  CHECK(b.known()[0] == -1);  // nothing applies yet
  CHECK(b.reading_pending());
  CHECK(b.pending_last() == 100);
  CHECK_FALSE(b.reading_due(kT0 + 5ms, kAll));
  CHECK(b.reading_due(kT0 + 10ms, kAll));
  // Later: 3/7 still open (now complete, lanes 5 and 6). The new reading is complete: lanes other
  // than 5, 6, 9 are resolved to 150, and the first reading is no longer needed.
  b.read(kT0 + 10ms, {150, {writer("3/7", true, lane_bit(5) | lane_bit(6)), writer("4/2", true, lane_bit(9))}});
  CHECK_FALSE(b.reading_pending());
  CHECK(b.known()[0] == 150);
  CHECK(b.known()[5] == -1);
  CHECK(b.known()[6] == -1);
  CHECK(b.known()[9] == -1);
  // 3/7 ended.
  b.read(kT0 + 20ms, {160, {writer("4/2", true, lane_bit(9))}});
  CHECK(b.known()[5] == 160);  // the new reading: 5 and 6 are free now
  CHECK(b.known()[6] == 160);
  CHECK(b.known()[9] == -1);
  // 4/2 ended too.
  b.read(kT0 + 30ms, {170, {}});
  CHECK(b.known()[9] == 170);
  CHECK(b.resolved() == 170);
}

TEST_CASE("lane bounds: a pending reading of an incomplete writer applies its lanes to its own last id") {
  LaneBounds b{kPace};
  b.set_owned(kAll);
  b.read(kT0, {100, {}});
  b.read(kT0 + 1ms, {200, {writer("7/1", false, 0)}});
  CHECK(b.reading_pending());
  b.read(kT0 + 12ms, {300, {writer("8/1", false, 0)}});  // 7/1 ended, 8/1 is new and unknown
  CHECK(b.resolved() == 200);                            // the first reading applied, not the second
  CHECK(b.pending_last() == 300);                        // which waits for 8/1 in turn
}

TEST_CASE("lane bounds: claims raise what is known, and a held lane stalls only itself") {
  LaneBounds b{kPace};
  b.set_owned(kAll);
  const LaneMask owned = kAll;
  b.read(kT0, {100, {writer("3/7", true, lane_bit(5))}});
  LaneIds bounds = all_lanes(120);
  bounds[5] = 40;  // lane 5 waits at its first missing id
  b.claimed(kT0 + 1ms, owned, bounds, 130);
  CHECK(b.resolved() == 40);
  CHECK(b.known()[5] == 40);
  CHECK(b.known()[6] == 120);
  CHECK(b.covered()[6] == 120);
  CHECK(b.held(owned) == kAll);  // every lane is below the last id drawn (130)
  CHECK(b.held(lane_bit(5)) == lane_bit(5));
  // The frontier reaches the last id drawn; lane 5 does not move: a reading at most every 100 ms.
  bounds = all_lanes(130);
  bounds[5] = 40;
  b.claimed(kT0 + 9ms, owned, bounds, 130);
  CHECK(b.held(owned) == lane_bit(5));
  b.unchanged(kT0 + 40ms, owned, 131);  // an id drawn above the frontier: stalled from here
  CHECK_FALSE(b.reading_due(kT0 + 45ms, owned));
  CHECK(b.reading_due(kT0 + 50ms, owned));  // the frontier stalled for 10 ms
  b.read(kT0 + 50ms, {131, {writer("3/7", true, lane_bit(5))}});
  // 131 was not visible after all: gone. The reading resolved it in every lane but 5, so the
  // claim's bounds are there (the function's bound is never below what it was told is known).
  LaneIds gone = all_lanes(131);
  gone[5] = 40;
  b.claimed(kT0 + 51ms, owned, gone, 131);
  CHECK_FALSE(b.reading_due(kT0 + 100ms, owned));
  CHECK(b.reading_due(kT0 + 150ms, owned));
  // The frontier stalls too: every 10 ms.
  b.read(kT0 + 150ms, {131, {writer("3/7", true, lane_bit(5))}});
  b.claimed(kT0 + 152ms, owned, bounds, 140);
  CHECK_FALSE(b.reading_due(kT0 + 158ms, owned));
  b.claimed(kT0 + 163ms, owned, bounds, 140);
  CHECK(b.reading_due(kT0 + 163ms, owned));
}

TEST_CASE("lane bounds: nothing held means no reading, and the lanes gained are uncovered") {
  LaneBounds b{kPace};
  b.set_owned(kAll);
  b.read(kT0, {10, {}});
  CHECK_FALSE(b.uniform());  // covered: nothing yet
  b.claimed(kT0 + 1ms, kAll, all_lanes(20), 20);
  CHECK(b.uniform());
  CHECK(b.held(kAll) == 0);
  CHECK_FALSE(b.reading_due(kT0 + 1s, kAll));
  b.unchanged(kT0 + 2s, kAll, 20);
  CHECK_FALSE(b.reading_due(kT0 + 3s, kAll));
  b.uncover();
  CHECK(b.covered()[0] == -1);
  CHECK(b.known()[0] == 20);  // what is resolved stays known
  b.reset();
  CHECK(b.known()[0] == -1);
  CHECK(b.reading_due(kT0 + 3s, kAll));
}

TEST_CASE("lane bounds: the writers holding events back and the lanes named") {
  WriterReading r{50, {writer("1/1", true, lane_bit(3)), writer("2/1", true, lane_bit(4)), writer("3/1", false, 0)}};
  const auto holding = writers_holding(r, lane_bit(3));
  REQUIRE(holding.size() == 2);
  CHECK(holding[0]->vxid == "1/1");
  CHECK(holding[1]->vxid == "3/1");  // lanes unknown: every lane
  CHECK(describe_lanes(lane_bit(3) | lane_bit(17) | lane_bit(63)) == "3,17,63");
  CHECK(describe_lanes(kAll) == "all");
  CHECK(describe_lanes(0).empty());
}

TEST_CASE("lane bounds: a sequence set back below what is known starts over, whatever reports it") {
  // TRUNCATE ... RESTART IDENTITY (or ALTER SEQUENCE ... RESTART) under a running relay: the new
  // ids 1, 2, ... are below every bound; keeping the bounds would publish them unread (issue 42).
  const LaneMask owned = kAll;
  SUBCASE("a claim's last id") {
    LaneBounds b{kPace};
    b.set_owned(owned);
    b.read(kT0, {500, {}});
    b.claimed(kT0 + 1ms, owned, all_lanes(500), 500);
    CHECK(b.resolved() == 500);
    b.claimed(kT0 + 2ms, owned, all_lanes(500), 0);  // the claim's bounds are the old ones: ignored
    CHECK(b.resolved() == -1);
    CHECK(b.covered()[7] == -1);
    CHECK(b.reading_due(kT0 + 2ms, owned));  // a reading comes first again
    b.read(kT0 + 3ms, {2, {writer("5/1", true, lane_bit(7))}});
    CHECK(b.known()[7] == -1);  // the writer of new id 1 or 2 holds its lane
    CHECK(b.known()[8] == 2);
  }
  SUBCASE("a poll that found nothing") {
    LaneBounds b{kPace};
    b.set_owned(owned);
    b.read(kT0, {500, {}});
    b.unchanged(kT0 + 1ms, owned, 3);
    CHECK(b.resolved() == -1);
  }
  SUBCASE("a reading") {
    LaneBounds b{kPace};
    b.set_owned(owned);
    b.read(kT0, {500, {writer("5/1", true, lane_bit(3))}});
    CHECK(b.known()[4] == 500);
    b.read(kT0 + 1ms, {4, {writer("6/1", true, lane_bit(4))}});
    CHECK(b.known()[3] == 4);  // 5/1 ended: what this reading says, and nothing of the old one
    CHECK(b.known()[4] == -1);
  }
  SUBCASE("not when the sequence only moved on") {
    LaneBounds b{kPace};
    b.set_owned(owned);
    b.read(kT0, {500, {}});
    b.unchanged(kT0 + 1ms, owned, 500);
    b.unchanged(kT0 + 2ms, owned, 501);
    CHECK(b.resolved() == 500);
  }
}

TEST_CASE("lane bounds: a reading whose sequence caches ids resolves nothing, nor does a pending one") {
  // With CACHE 20, a session holding no lock may draw an id below the reading's last id later.
  LaneBounds b{kPace};
  b.set_owned(kAll);
  b.read(kT0, {100, {}});
  CHECK(b.resolved() == 100);
  b.read(kT0 + 1ms, {200, {writer("7/1", false, 0)}});
  CHECK(b.reading_pending());
  WriterReading cached{300, {}};
  cached.sequence_cache = 20;
  b.read(kT0 + 12ms, cached);
  CHECK(b.resolved() == 100);  // neither 200 (pending, 7/1 ended) nor 300
  CHECK_FALSE(b.reading_pending());
  b.read(kT0 + 20ms, {320, {}});  // CACHE 1 again
  CHECK(b.resolved() == 320);
}

TEST_CASE("lane bounds: a writer a reading did not see holds only ids above that reading's last id") {
  // Found by tests/fuzz: event 100 of lane 5 committed above a rolled-back id; every reading after
  // that saw a writer of lane 5 that began after the commit, so lane 5 waited for a chain of them.
  LaneBounds b{kPace};
  b.set_owned(kAll);
  b.read(kT0, {90, {writer("3/1", true, lane_bit(5))}});  // 3/1: open before anything was known
  CHECK(b.known()[5] == -1);
  b.read(kT0 + 30ms, {120, {writer("3/1", true, lane_bit(5)), writer("4/1", true, lane_bit(5))}});
  CHECK(b.known()[5] == -1);  // 3/1 is still open: it may hold any id up to 90
  b.read(kT0 + 60ms, {150, {writer("4/1", true, lane_bit(5)), writer("5/1", true, lane_bit(5))}});
  CHECK(b.known()[5] == 90);  // 4/1 was first seen by the reading after the one of last id 90
  b.read(kT0 + 90ms, {180, {writer("5/1", true, lane_bit(5)), writer("6/1", true, lane_bit(5))}});
  CHECK(b.known()[5] == 120);  // a chain of overlapping writers no longer holds the lane for good
  CHECK(b.known()[6] == 180);
  SUBCASE("a writer whose lanes are unknown holds every lane, but only above its own bound") {
    b.read(kT0 + 120ms, {200, {writer("6/1", true, lane_bit(5)), writer("7/1", false, 0)}});
    CHECK(b.known()[5] == 150);
    CHECK(b.known()[6] == 180);  // 7/1 may hold an id of lane 6 above 180, none below
  }
  SUBCASE("a prepared transaction first seen prepared holds only ids above the previous reading") {
    // Found by the fuzzer in CI: an event of lane 9 waited for a transaction of its lane that
    // began after its commit and was prepared before a reading saw it.
    LaneBounds p{kPace};
    p.set_owned(kAll);
    p.read(kT0, {100, {writer("1/1", true, lane_bit(9))}});
    p.read(kT0 + 30ms, {150, {writer("1/1", true, lane_bit(9))}});
    CHECK(p.known()[9] == -1);
    OpenWriter prepared = writer("2/1", true, lane_bit(9));
    prepared.gid = "xa-1";
    p.read(kT0 + 60ms, {200, {prepared}});  // 1/1 ended; 2/1 began after the reading of last id 150
    CHECK(p.known()[9] == 150);
    CHECK(p.known()[5] == 200);
  }
  SUBCASE("not across a sequence that caches ids") {
    WriterReading cached{200, {writer("6/1", true, lane_bit(5))}};
    cached.sequence_cache = 20;
    b.read(kT0 + 120ms, cached);
    b.read(kT0 + 150ms, {210, {writer("6/1", true, lane_bit(5)), writer("9/1", true, lane_bit(5))}});
    CHECK(b.known()[5] == 120);  // no earlier reading to tell new writers by
  }
}
