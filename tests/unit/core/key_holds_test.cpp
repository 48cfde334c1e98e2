// Per-key order after a failure (core/key_holds.hpp): pure logic, table-tested.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "core/key_holds.hpp"

using namespace outbox;

namespace {

std::string kinds(const std::vector<Outcome>& outcomes) {
  std::string out;
  for (const auto& o : outcomes) {
    switch (o.kind) {
      case OutcomeKind::kDelivered: out += 'D'; break;
      case OutcomeKind::kRetry: out += 'R'; break;
      case OutcomeKind::kPermanent: out += 'P'; break;
      case OutcomeKind::kDeferred: out += 'F'; break;
    }
  }
  return out;
}

std::vector<Outcome> outcomes_of(const std::string& kinds_text) {
  std::vector<Outcome> out;
  for (char c : kinds_text) {
    switch (c) {
      case 'D': out.push_back(Outcome::delivered()); break;
      case 'R': out.push_back(Outcome::retry("r")); break;
      case 'P': out.push_back(Outcome::permanent("p")); break;
      case 'F': out.push_back(Outcome::deferred()); break;
    }
  }
  return out;
}

struct Batch {
  std::vector<Event> events;
  std::vector<const Event*> pointers;
  explicit Batch(const std::vector<std::string>& keys) {
    for (std::size_t i = 0; i < keys.size(); ++i) {
      Event e;
      e.id = static_cast<EventId>(i + 1);
      e.key = keys[i];
      events.push_back(e);
    }
    for (const auto& e : events) pointers.push_back(&e);
  }
};

}  // namespace

TEST_CASE("a later delivered event of a key that must retry is not counted as delivered") {
  struct Case {
    std::vector<std::string> keys;
    std::string in;
    std::string out;
  };
  const std::vector<Case> cases{
      {{"a", "a", "a"}, "DDD", "DDD"},
      {{"a", "a", "a"}, "RDD", "RRR"},         // a retry holds back every later event of its key
      {{"a", "b", "a", "b"}, "RDDD", "RDRD"},  // other keys flow
      {{"a", "a", "a"}, "DRD", "DRR"},         // earlier deliveries stand
      {{"a", "a"}, "FD", "FR"},                // deferred holds the key too
      {{"a", "a", "a"}, "PDD", "PDD"},         // a dead letter releases its key
      {{"a", "a", "a"}, "RPD", "RPR"},         // a permanent outcome stays permanent
      {{"a", "b", "c"}, "RRR", "RRR"},
      {{}, "", ""},
  };
  for (const auto& c : cases) {
    Batch batch(c.keys);
    auto outcomes = outcomes_of(c.in);
    hold_back_after_failures(batch.pointers, outcomes);
    CAPTURE(c.in);
    CHECK(kinds(outcomes) == c.out);
  }
  Batch batch({"a", "a"});
  auto outcomes = outcomes_of("RD");
  hold_back_after_failures(batch.pointers, outcomes);
  CHECK(outcomes[1].reason.find("earlier event of the same key") != std::string::npos);
}

TEST_CASE("KeyHolds holds the later events of a key behind its smallest held id") {
  KeyHolds held;
  Event e5, e7, e9, other;
  e5.id = 5;
  e5.key = "k";
  e7.id = 7;
  e7.key = "k";
  e9.id = 9;
  e9.key = "k";
  other.id = 8;
  other.key = "o";
  held.hold("k", 7);
  CHECK_FALSE(held.holds(e5));
  CHECK_FALSE(held.holds(e7));  // the held event itself is not behind anything
  CHECK(held.holds(e9));
  CHECK_FALSE(held.holds(other));
  KeyHolds earlier;
  earlier.hold("k", 4);
  held.merge(earlier);
  CHECK(held.holds(e5));  // the smallest id wins
  held.hold("k", 6);
  CHECK(held.holds(e5));
  held.clear();
  CHECK(held.empty());
  CHECK_FALSE(held.holds(e9));
}

namespace {

Event keyed(EventId id, std::string key) {
  Event e;
  e.id = id;
  e.key = std::move(key);
  return e;
}

}  // namespace

TEST_CASE("events_behind: an event waits only while an event of its key is in flight") {
  const std::vector<Event> in_flight{keyed(1, "a"), keyed(2, "b"), keyed(3, "a")};
  const std::vector<Event> next{keyed(4, "a"), keyed(5, "c"), keyed(6, "b"), keyed(7, "c"), keyed(8, "")};
  CHECK(events_behind(next, in_flight) == std::vector<bool>{true, false, true, false, false});
  // Nothing in flight: nothing waits.
  CHECK(events_behind(next, {}) == std::vector<bool>(5, false));
  CHECK(events_behind({}, in_flight).empty());
  // The empty key is a key like any other.
  const std::vector<Event> empty_key{keyed(9, "")};
  CHECK(events_behind(next, empty_key) == std::vector<bool>{false, false, false, false, true});
}
