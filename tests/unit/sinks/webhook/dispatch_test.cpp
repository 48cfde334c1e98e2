#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "sinks/webhook/dispatch.hpp"

using namespace outbox;
using outbox::sinks::webhook::KeyedDispatch;

namespace {

struct Batch {
  std::vector<Event> events;
  std::vector<const Event*> pointers;

  explicit Batch(const std::vector<std::string>& keys) {
    events.reserve(keys.size());
    for (std::size_t i = 0; i < keys.size(); ++i) {
      Event e;
      e.id = static_cast<EventId>(100 + i);
      e.key = keys[i];
      events.push_back(e);
    }
    for (const auto& e : events) pointers.push_back(&e);
  }
};

// Everything next() hands out until it says nullopt.
std::vector<std::size_t> drain(KeyedDispatch& d) {
  std::vector<std::size_t> out;
  while (auto i = d.next()) out.push_back(*i);
  return out;
}

}  // namespace

TEST_CASE("different keys start at once, one event per key") {
  Batch b({"a", "b", "a", "c", "b", "a"});
  KeyedDispatch d(b.pointers);
  CHECK(drain(d) == std::vector<std::size_t>{0, 1, 3});  // keys in order of their first event
  CHECK(d.in_flight() == 3);
}

TEST_CASE("a key's next event starts only after its previous one ended, in order") {
  Batch b({"a", "b", "a", "c", "b", "a"});
  KeyedDispatch d(b.pointers);
  drain(d);
  d.finish(1, false);  // b's first done
  CHECK(drain(d) == std::vector<std::size_t>{4});
  d.finish(0, false);  // a's first done
  CHECK(drain(d) == std::vector<std::size_t>{2});
  d.finish(2, false);
  CHECK(drain(d) == std::vector<std::size_t>{5});
  d.finish(3, false);
  d.finish(4, false);
  d.finish(5, false);
  CHECK_FALSE(d.next().has_value());
  CHECK(d.in_flight() == 0);
  CHECK(d.unsent().empty());
}

TEST_CASE("a retry holds back the rest of its key; other keys go on") {
  Batch b({"a", "b", "a", "b", "a"});
  KeyedDispatch d(b.pointers);
  CHECK(drain(d) == std::vector<std::size_t>{0, 1});
  d.finish(0, /*hold_key=*/true);
  CHECK_FALSE(d.next().has_value());  // nothing of a
  d.finish(1, false);
  CHECK(drain(d) == std::vector<std::size_t>{3});
  d.finish(3, false);
  CHECK_FALSE(d.next().has_value());
  const auto unsent = d.unsent();
  REQUIRE(unsent.size() == 2);
  CHECK(unsent[0].index == 2);
  CHECK(unsent[0].blocked);
  CHECK(unsent[1].index == 4);
  CHECK(unsent[1].blocked);
}

TEST_CASE("events never reached are unsent but not blocked") {
  Batch b({"a", "a", "b"});
  KeyedDispatch d(b.pointers);
  CHECK(d.next() == 0u);  // the sink stops asking, e.g. at its batch deadline
  d.finish(0, false);
  const auto unsent = d.unsent();
  REQUIRE(unsent.size() == 2);
  CHECK(unsent[0].index == 1);
  CHECK_FALSE(unsent[0].blocked);
  CHECK(unsent[1].index == 2);
  CHECK_FALSE(unsent[1].blocked);
}

TEST_CASE("a key that succeeded goes to the back of the queue") {
  Batch b({"a", "a", "a", "b", "c"});
  KeyedDispatch d(b.pointers);
  CHECK(d.next() == 0u);
  d.finish(0, false);  // a is ready again, behind b and c
  CHECK(drain(d) == std::vector<std::size_t>{3, 4, 1});
}

TEST_CASE("per key, the hand-out order is the given order whatever the completion order") {
  std::vector<std::string> keys;
  for (int i = 0; i < 200; ++i) keys.push_back("k" + std::to_string((i * 7) % 13));
  Batch b(keys);
  KeyedDispatch d(b.pointers);
  std::vector<std::size_t> order;
  std::vector<std::size_t> running;
  for (int round = 0; round < 1000 && (order.size() < keys.size()); ++round) {
    while (running.size() < 5) {  // a max_in_flight of 5
      auto i = d.next();
      if (!i) break;
      running.push_back(*i);
      order.push_back(*i);
    }
    // Finish the newest first, to scramble completion order.
    const std::size_t done = running.back();
    running.pop_back();
    d.finish(done, false);
  }
  REQUIRE(order.size() == keys.size());
  for (std::size_t x = 0; x < order.size(); ++x) {
    for (std::size_t y = x + 1; y < order.size(); ++y) {
      if (keys[order[x]] == keys[order[y]]) CHECK(order[x] < order[y]);
    }
  }
}

TEST_CASE("an empty batch has nothing to send") {
  Batch b({});
  KeyedDispatch d(b.pointers);
  CHECK_FALSE(d.next().has_value());
  CHECK(d.unsent().empty());
}

TEST_CASE("ready() says whether next() would hand out an event (the pipelined sink waits on it)") {
  Batch b({"a", "a", "b"});
  KeyedDispatch d(b.pointers);
  CHECK(d.ready());
  CHECK(drain(d) == std::vector<std::size_t>{0, 2});
  CHECK_FALSE(d.ready());  // a busy, b finished handing out
  d.finish(2, false);
  CHECK_FALSE(d.ready());  // b has nothing more
  d.finish(0, true);       // a held: its next event is not ready
  CHECK_FALSE(d.ready());
  CHECK_FALSE(d.next().has_value());
}

TEST_CASE("ready() after a key's event ended and the key has more") {
  Batch b({"a", "a"});
  KeyedDispatch d(b.pointers);
  CHECK(drain(d) == std::vector<std::size_t>{0});
  CHECK_FALSE(d.ready());
  d.finish(0, false);
  CHECK(d.ready());
  CHECK(drain(d) == std::vector<std::size_t>{1});
}
