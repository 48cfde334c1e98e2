// The loop against a fake store, fake sinks and a fake clock: one thread, no sleeps.
#include <doctest/doctest.h>

#include <deque>
#include <map>
#include <mutex>
#include <stdexcept>

#include "core/loop.hpp"
#include "support/clock.hpp"
#include "support/options.hpp"

using namespace outbox;
using std::chrono::milliseconds;
using Kind = Completion::Kind;

namespace {

using outbox::testing::FakeClock;

class FakeStore final : public Store {
 public:
  // A poll: records the completions it carries, then claims (what PgStore does in one call).
  // The drain claims on its thread while a helper completes: the mutex keeps that race-free.
  std::vector<Event> probe_claim(std::size_t limit, std::span<const Completion> c) override {
    {
      std::lock_guard lock(mutex);
      ++probes;
      if (fail_probes > 0) {
        --fail_probes;
        throw StoreUnavailable("connection lost");
      }
      carried.push_back(std::vector<Completion>(c.begin(), c.end()));
      completed.insert(completed.end(), c.begin(), c.end());
    }
    return claim(limit);
  }
  std::vector<Event> claim(std::size_t limit) override { return take(limit, 0); }
  std::vector<Event> claim_above(std::size_t limit, long long floor) override { return take(limit, floor); }
  std::vector<Event> take(std::size_t limit, long long floor) {
    std::lock_guard lock(mutex);
    ++claims;
    floors.push_back(floor);
    written_at_claim.push_back(completed.size());
    last_limit = limit;
    if (batches.empty()) return {};
    auto batch = std::move(batches.front());
    batches.pop_front();
    return batch;
  }
  void complete(std::span<const Completion> c) override {
    std::lock_guard lock(mutex);
    if (fail_completes > 0) {
      --fail_completes;
      throw StoreUnavailable("connection lost");
    }
    completed.insert(completed.end(), c.begin(), c.end());
  }
  const Completion& of(EventId id) const {
    for (const auto& c : completed) {
      if (c.id == id) return c;
    }
    FAIL("no completion for id " << id);
    static Completion none;
    return none;
  }
  std::deque<std::vector<Event>> batches;
  std::vector<Completion> completed;
  std::vector<std::vector<Completion>> carried;  // what each poll wrote
  std::vector<std::size_t> written_at_claim;     // completions written when each claim began
  std::vector<long long> floors;                 // each claim's floor (Store::claim_above; 0: claim())
  std::mutex mutex;
  int fail_completes = 0;
  int fail_probes = 0;
  int probes = 0;
  int claims = 0;
  std::size_t last_limit = 0;
  std::vector<std::size_t> claim_bytes;  // every limit_claim_bytes() in turn
  void limit_claim_bytes(std::size_t bytes) override { claim_bytes.push_back(bytes); }
};

// Answers with a scripted outcome per event id (default: delivered) and records what it saw.
class FakeSink final : public NamedSink {
 public:
  explicit FakeSink(std::string name) : NamedSink(std::move(name)) {}
  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    for (const Event* e : events) {
      if (throws_at == e->id) throw std::runtime_error("boom at " + std::to_string(e->id));
      if (throws_other_at == e->id) throw 42;
    }
    std::vector<Outcome> out;
    sizes.push_back(events.size());
    for (const Event* e : events) {
      seen.push_back(e->id);
      headers_seen[e->id] = e->headers;
      auto it = script.find(e->id);
      out.push_back(it == script.end() ? Outcome::delivered() : it->second);
    }
    if (short_answer) out.pop_back();
    return out;
  }
  bool reserves_header(std::string_view name) const override {
    return is_outbox_header(name) || (!also_reserved.empty() && header_has_prefix(name, also_reserved));
  }
  std::map<EventId, Outcome> script;
  std::vector<EventId> seen;
  std::vector<std::size_t> sizes;  // of each publish() call's events
  std::map<EventId, std::vector<Header>> headers_seen;
  std::string also_reserved;  // a prefix (lower case) this sink reserves beside outbox-*
  bool short_answer = false;
  EventId throws_at = 0;        // publish() throws std::runtime_error on a batch holding this id
  EventId throws_other_at = 0;  // ... throws an int
};

class CountingMetrics final : public Metrics {
 public:
  void delivered(const std::string& sink, double latency) override {
    ++delivered_by[sink];
    last_latency = latency;
  }
  void retried(const std::string& sink) override { ++retried_by[sink]; }
  void dead_lettered(const std::string& sink) override { ++dead_by[sink]; }
  void headers_dropped(const std::string& sink, std::size_t n) override { dropped_by[sink] += static_cast<int>(n); }
  std::map<std::string, int> delivered_by, retried_by, dead_by, dropped_by;
  double last_latency = -1;
};

Event event(EventId id, std::string key = "k", std::string topic = "order.paid") {
  Event e;
  e.id = id;
  e.topic = std::move(topic);
  e.key = std::move(key);
  e.payload = R"({"n":1})";
  e.headers_json = "{}";
  e.created_at = "1970-01-01T00:00:00.500000Z";
  e.created_at_us = 500'000;
  return e;
}

struct Fixture {
  FakeStore store;
  FakeSink a{"a"};
  FakeSink b{"b"};
  FakeClock clock;
  CountingMetrics metrics;
  LoopOptions options = outbox::testing::loop_options(500, 3, BackoffPolicy{milliseconds(100), milliseconds(2000)});

  Router one{{}, 1};

  RelayLoop make(const Router& router, std::vector<Sink*> sinks) {
    return RelayLoop(store, std::move(sinks), router, clock, metrics, options, [] { return 0.0; });
  }
  // Every topic to sink a.
  RelayLoop one_sink() { return make(one, {&a}); }
};

// What the runner passes for a poll (Store::probe_claim first).
DrainControl polling() {
  DrainControl c;
  c.probe = true;
  return c;
}

}  // namespace

TEST_CASE("a delivered batch is completed once, in id order, with commit-to-ack latency") {
  Fixture f;
  f.store.batches.push_back({event(1), event(2, "j"), event(3)});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  const auto r = loop.run_once();
  CHECK(r.claimed == 3);
  CHECK(r.delivered == 3);
  CHECK(f.store.last_limit == 500);
  CHECK(f.a.seen == std::vector<EventId>{1, 2, 3});
  REQUIRE(f.store.completed.size() == 3);
  for (const auto& c : f.store.completed) CHECK(c.kind == Kind::kDelivered);
  CHECK(f.metrics.delivered_by["a"] == 3);
  CHECK(f.metrics.last_latency == doctest::Approx(0.5));
  CHECK_FALSE(loop.next_retry_due().has_value());
}

TEST_CASE("an empty claim publishes nothing") {
  Fixture f;
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  CHECK(loop.run_once().claimed == 0);
  CHECK(f.a.seen.empty());
  CHECK(f.store.completed.empty());
}

TEST_CASE("retry backs off exponentially and dead-letters at max_attempts") {
  Fixture f;
  f.a.script[1] = Outcome::retry("broker down");
  Event first = event(1);
  Event third = event(1);
  third.attempts = 2;  // this attempt is the 3rd = max_attempts
  f.store.batches.push_back({first, event(2, "other")});
  f.store.batches.push_back({third});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});

  const auto r = loop.run_once();
  CHECK(r.retried == 1);
  CHECK(r.delivered == 1);
  const Completion& c = f.store.of(1);
  CHECK(c.kind == Kind::kRetry);
  CHECK(c.delay == milliseconds(50));  // 100ms * 2^0, jitter 0 -> half
  CHECK(c.error == "a: broker down");
  REQUIRE(loop.next_retry_due().has_value());
  CHECK(*loop.next_retry_due() == f.clock.t + milliseconds(50) + milliseconds(20));  // + slack
  CHECK(f.metrics.retried_by["a"] == 1);

  f.store.completed.clear();
  loop.run_once();
  const Completion& dead = f.store.of(1);
  CHECK(dead.kind == Kind::kDeadLetter);
  CHECK(dead.error == "gave up after 3 attempts: a: broker down");
  CHECK(f.metrics.dead_by["a"] == 1);
}

TEST_CASE("a sink's Retry-After raises the delay, capped by the backoff max") {
  Fixture f;
  f.a.script[1] = Outcome::retry("429", milliseconds(1500));
  f.a.script[2] = Outcome::retry("429", milliseconds(60'000));
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  loop.run_once();
  CHECK(f.store.of(1).delay == milliseconds(1500));
  CHECK(f.store.of(2).delay == milliseconds(2000));
}

TEST_CASE("permanent outcomes dead-letter at once; the rest of the batch flows") {
  Fixture f;
  f.a.script[2] = Outcome::permanent("message too large");
  f.store.batches.push_back({event(1), event(2, "big"), event(3)});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  const auto r = loop.run_once();
  CHECK(r.dead_lettered == 1);
  CHECK(r.delivered == 2);
  CHECK(f.store.of(2).kind == Kind::kDeadLetter);
  CHECK(f.store.of(2).error == "a: message too large");
  CHECK(f.store.of(1).kind == Kind::kDelivered);
  CHECK(f.store.of(3).kind == Kind::kDelivered);
}

TEST_CASE("bad rows are dead-lettered by the loop without reaching a sink") {
  Fixture f;
  Event bad_headers = event(2);
  bad_headers.headers_json = R"({"n": 1})";
  Event unrouted = event(3, "k", "invoice.sent");
  Event with_headers = event(4);
  with_headers.headers_json = R"({"trace": "abc"})";
  f.store.batches.push_back({event(1), bad_headers, unrouted, with_headers});
  Router router({Route{{"order.*"}, {0}}}, 1);
  auto loop = f.make(router, {&f.a});
  loop.run_once();
  CHECK(f.a.seen == std::vector<EventId>{1, 4});
  CHECK(f.store.of(2).kind == Kind::kDeadLetter);
  CHECK(f.store.of(2).error == "invalid event: header 'n' must be a string, got number");
  CHECK(f.store.of(3).kind == Kind::kDeadLetter);
  CHECK(f.store.of(3).error == "no route matches topic 'invoice.sent'");
  CHECK(f.store.of(4).kind == Kind::kDelivered);
  CHECK(f.metrics.dead_by["relay"] == 2);
}

TEST_CASE("a row's headers that a sink reserves never reach it, whatever their case; each sink drops its own") {
  Fixture f;
  f.b.also_reserved = "x-";
  Event spoof = event(1);
  spoof.headers_json = R"({"outbox-id": "999999", "Outbox-Topic": "spoofed", "x-delay": "5", "trace": "abc"})";
  Event plain = event(2, "j");
  plain.headers_json = R"({"trace": "def"})";
  f.store.batches.push_back({spoof, plain});
  Router both({}, 2);
  auto loop = f.make(both, {&f.a, &f.b});
  CHECK(loop.run_once().delivered == 2);
  using H = std::vector<Header>;
  CHECK(f.a.headers_seen[1] == H{{"trace", "abc"}, {"x-delay", "5"}});
  CHECK(f.b.headers_seen[1] == H{{"trace", "abc"}});
  CHECK(f.a.headers_seen[2] == H{{"trace", "def"}});
  CHECK(f.b.headers_seen[2] == H{{"trace", "def"}});
  CHECK(f.metrics.dropped_by["a"] == 2);
  CHECK(f.metrics.dropped_by["b"] == 3);
  CHECK(f.store.of(1).kind == Kind::kDelivered);  // dropped headers do not fail the event
}

TEST_CASE("an event whose created_at the relay cannot carry is dead-lettered by the loop; its key flows on") {
  Fixture f;
  Event infinite = event(1);
  infinite.created_at.clear();  // the claim's created_at_us was NULL: infinity, or beyond the year 9999
  infinite.created_at_us = 0;
  f.store.batches.push_back({infinite, event(2)});
  auto loop = f.one_sink();
  const auto r = loop.run_once();
  CHECK(r.dead_lettered == 1);
  CHECK(r.delivered == 1);
  CHECK(f.a.seen == std::vector<EventId>{2});
  CHECK(f.store.of(1).kind == Kind::kDeadLetter);
  CHECK(f.store.of(1).error.find("created_at") != std::string::npos);
  CHECK(f.metrics.dead_by["relay"] == 1);
}

TEST_CASE("several sinks: done when all acknowledged, a retry goes only to the sinks that have not") {
  Fixture f;
  f.b.script[1] = Outcome::retry("timeout");
  f.store.batches.push_back({event(1)});
  Router router({}, 2);
  auto loop = f.make(router, {&f.a, &f.b});
  loop.run_once();
  const Completion& c = f.store.of(1);
  CHECK(c.kind == Kind::kRetry);
  CHECK(c.sinks_done == std::vector<std::string>{"a"});

  // The retried row comes back with sinks_done = [a]: only b sees it again.
  Event again = event(1);
  again.attempts = 1;
  again.sinks_done = {"a"};
  f.b.script.clear();
  f.store.batches.push_back({again});
  f.store.completed.clear();
  loop.run_once();
  CHECK(f.a.seen == std::vector<EventId>{1});
  CHECK(f.b.seen == std::vector<EventId>{1, 1});
  CHECK(f.store.of(1).kind == Kind::kDelivered);
}

TEST_CASE("deferred events are released without counting an attempt") {
  Fixture f;
  f.a.script[1] = Outcome::retry("500");
  f.a.script[2] = Outcome::deferred();
  f.store.batches.push_back({event(1), event(2)});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  const auto r = loop.run_once();
  CHECK(r.released == 1);
  CHECK(f.store.of(1).kind == Kind::kRetry);
  CHECK(f.store.of(2).kind == Kind::kRelease);
}

TEST_CASE("outcomes survive a lost session: applied after reconnect, nothing re-published") {
  Fixture f;
  f.store.fail_completes = 1;
  f.store.batches.push_back({event(1), event(2)});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  CHECK_THROWS_AS(loop.run_once(), StoreUnavailable);
  CHECK(f.store.completed.empty());
  loop.flush_pending();
  CHECK(f.store.completed.size() == 2);
  CHECK(f.a.seen == std::vector<EventId>{1, 2});
  loop.run_once();  // nothing left over: no second completion
  CHECK(f.store.completed.size() == 2);
}

TEST_CASE("a sink answering with the wrong number of outcomes makes its events retry") {
  Fixture f;
  f.a.short_answer = true;
  f.store.batches.push_back({event(1), event(2)});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  loop.run_once();
  CHECK(f.store.of(1).kind == Kind::kRetry);
  CHECK(f.store.of(2).kind == Kind::kRetry);
  CHECK(f.store.of(2).error.find("sink returned 1 outcomes for 2 events") != std::string::npos);
}

// drain(): batch k is published on a helper thread while batch k-1 completes and k+1 is claimed.

TEST_CASE("drain publishes every batch in order and stops after a short claim") {
  Fixture f;
  f.options.batch_size = 2;
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "x"), event(4, "y")});
  f.store.batches.push_back({event(5, "x")});
  f.store.batches.push_back({event(6, "x")});  // never claimed: the claim before it was short
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  const auto r = loop.drain({});
  CHECK(r.claimed == 5);
  CHECK(r.delivered == 5);
  CHECK(f.store.claims == 3);
  CHECK(f.a.seen == std::vector<EventId>{1, 2, 3, 4, 5});
  REQUIRE(f.store.completed.size() == 5);
  for (EventId id = 1; id <= 5; ++id) CHECK(f.store.of(id).kind == Kind::kDelivered);
}

TEST_CASE("a drain claims ahead above the batch in the sinks while every batch was delivered") {
  Fixture f;
  f.options.batch_size = 2;
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "x"), event(4, "y")});
  f.store.batches.push_back({event(5, "x"), event(6, "y")});
  f.store.batches.push_back({event(7, "x")});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  CHECK(loop.drain({}).delivered == 7);
  // The first claim looks from the start; each claim ahead from the batch in the sinks.
  CHECK(f.store.floors == std::vector<long long>{0, 2, 4, 6});
}

TEST_CASE("after a batch that was not all delivered, a drain's claims look from the start again") {
  Fixture f;
  f.options.batch_size = 2;
  f.a.script[2] = Outcome::retry("500");
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "x"), event(4, "z")});
  f.store.batches.push_back({event(5, "x"), event(6, "z")});
  f.store.batches.push_back({event(7, "x")});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  loop.drain({});
  // Batch 2 was claimed ahead before batch 1's retry was known (2 was leased then: not claimable
  // anyway); every later claim looks from the start, where the retry of 2 is.
  CHECK(f.store.floors == std::vector<long long>{0, 2, 0, 0});
  CHECK(f.store.of(2).kind == Kind::kRetry);
}

TEST_CASE("drain holds back later events of a key that failed in the batch before") {
  Fixture f;
  f.options.batch_size = 3;
  f.a.script[10] = Outcome::retry("500");
  // Batch 2 was claimed before batch 1's outcomes were written: it holds a later event of key k
  // (11, held back), an earlier one (8, released by an earlier batch: not held) and other keys.
  f.store.batches.push_back({event(10, "k"), event(12, "j"), event(13, "m")});
  f.store.batches.push_back({event(8, "k"), event(11, "k"), event(14, "j")});
  // Batch 3 was claimed after batch 1's outcomes but before batch 2's: 15 waits for 11.
  f.store.batches.push_back({event(15, "k"), event(16, "j")});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  const auto r = loop.drain({});
  CHECK(f.a.seen == std::vector<EventId>{10, 12, 13, 8, 14, 16});
  CHECK(f.store.of(10).kind == Kind::kRetry);
  CHECK(f.store.of(8).kind == Kind::kDelivered);
  CHECK(f.store.of(11).kind == Kind::kRelease);
  CHECK(f.store.of(11).error.empty());
  CHECK(f.store.of(15).kind == Kind::kRelease);
  CHECK(f.store.of(16).kind == Kind::kDelivered);
  CHECK(r.released == 2);
  CHECK(r.retried == 1);
  // Released events are claimable again at once: the drain looked again after the short batch.
  CHECK(f.store.claims == 4);
}

TEST_CASE("drain holds back events of a key that failed two batches before") {
  Fixture f;
  f.options.batch_size = 3;
  f.a.script[10] = Outcome::retry("500");
  // Batch 3 is claimed while batch 1's outcomes are being written: it may not see the retry.
  f.store.batches.push_back({event(10, "k"), event(12, "j"), event(13, "m")});
  f.store.batches.push_back({event(14, "j"), event(15, "m"), event(16, "n")});
  f.store.batches.push_back({event(17, "k"), event(18, "j")});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  loop.drain({});
  CHECK(f.a.seen == std::vector<EventId>{10, 12, 13, 14, 15, 16, 18});
  CHECK(f.store.of(17).kind == Kind::kRelease);
}

TEST_CASE("a batch claimed after the outcomes were written holds nothing back") {
  Fixture f;
  f.options.batch_size = 3;
  f.a.script[1] = Outcome::retry("500");
  f.a.script[2] = Outcome::deferred();
  // Short but with a release: completed, then claimed again. The store's own head-of-line rule
  // applies to that claim (this fake has none), so the loop holds nothing back.
  f.store.batches.push_back({event(1, "k"), event(2, "k")});
  f.store.batches.push_back({event(3, "k")});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  loop.drain({});
  CHECK(f.a.seen == std::vector<EventId>{1, 2, 3});
  CHECK(f.store.of(2).kind == Kind::kRelease);
  CHECK(f.store.of(3).kind == Kind::kDelivered);
  CHECK(f.store.claims == 2);  // the second claim was short, with nothing released: done
}

TEST_CASE("drain keeps the outcomes of both batches when the session is lost mid-pipeline") {
  Fixture f;
  f.options.batch_size = 2;
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "x"), event(4, "y")});
  f.store.batches.push_back({event(5, "x")});
  f.store.batches.push_back({event(5, "x")});  // claimable again after its release
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  f.store.fail_completes = 1;  // batch 1's complete, while batch 2 is published and 3 claimed
  CHECK_THROWS_AS(loop.drain({}), StoreUnavailable);
  CHECK(f.store.completed.empty());
  CHECK(f.a.seen == std::vector<EventId>{1, 2, 3, 4});  // batch 3 was claimed but not published
  loop.drain({});  // applies both batches' outcomes and hands batch 3 back, then goes on
  CHECK(f.a.seen == std::vector<EventId>{1, 2, 3, 4, 5});
  REQUIRE(f.store.completed.size() == 6);
  for (std::size_t i = 0; i < 4; ++i) {
    CHECK(f.store.completed[i].id == static_cast<EventId>(i + 1));
    CHECK(f.store.completed[i].kind == Kind::kDelivered);
  }
  CHECK(f.store.completed[4].id == 5);
  CHECK(f.store.completed[4].kind == Kind::kRelease);
  CHECK(f.store.completed[5].id == 5);
  CHECK(f.store.completed[5].kind == Kind::kDelivered);
}

TEST_CASE("drain stops claiming on stop and pauses with nothing in flight") {
  Fixture f;
  f.options.batch_size = 1;
  for (EventId id = 1; id <= 5; ++id) f.store.batches.push_back({event(id)});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  DrainControl control;
  std::vector<std::size_t> completed_at_pause;
  control.pause_due = [&] { return f.store.claims == 2; };
  control.pause = [&] { completed_at_pause.push_back(f.store.completed.size()); };
  control.stop = [&] { return f.store.claims == 4; };
  loop.drain(control);
  // The pause came after batch 2, with batches 1 and 2 completed and nothing claimed beyond.
  CHECK(completed_at_pause == std::vector<std::size_t>{2});
  // The stop came with batch 4 claimed while batch 3 was in the sink: 4 goes back unpublished.
  CHECK(f.a.seen == std::vector<EventId>{1, 2, 3});
  REQUIRE(f.store.completed.size() == 4);
  CHECK(f.store.of(4).kind == Kind::kRelease);
}

TEST_CASE("a stop that comes while a batch is in the sinks hands the next claimed batch back") {
  Fixture f;
  f.options.batch_size = 2;
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "x"), event(4, "y")});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  DrainControl control;
  control.stop = [&] { return f.store.claims == 2; };  // stop arrives after the second claim
  loop.drain(control);
  CHECK(f.a.seen == std::vector<EventId>{1, 2});
  REQUIRE(f.store.completed.size() == 4);
  CHECK(f.store.of(1).kind == Kind::kDelivered);
  CHECK(f.store.of(3).kind == Kind::kRelease);
  CHECK(f.store.of(4).kind == Kind::kRelease);
}

// Polls (DrainControl::probe): a steady stream's batch is short; its outcomes ride with the next poll.

TEST_CASE("with outcome_delay 0, a poll leaves a short batch's outcomes to the next poll, which writes them first") {
  Fixture f;
  f.options.outcome_delay = milliseconds(0);
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "x")});
  auto loop = f.one_sink();
  const DrainControl poll = polling();
  CHECK(loop.drain(poll).delivered == 2);
  CHECK(f.store.completed.empty());  // no separate complete for a short batch
  CHECK(loop.has_pending());
  CHECK(loop.drain(poll).delivered == 1);
  REQUIRE(f.store.carried.size() == 2);
  CHECK(f.store.carried[0].empty());
  REQUIRE(f.store.carried[1].size() == 2);  // batch 1's outcomes, written by the poll that claimed 3
  CHECK(f.store.carried[1][0].id == 1);
  CHECK(f.store.carried[1][1].id == 2);
  loop.drain(poll);  // nothing new: still writes batch 2's outcome
  CHECK(f.store.of(3).kind == Kind::kDelivered);
  CHECK_FALSE(loop.has_pending());
  CHECK(f.store.claims == 3);
  CHECK(f.store.probes == 3);
}

// A sink that keeps progress downstream (Kafka exactly once) trims it once an outcome is written:
// the outcomes must survive a crash of Postgres, and a claim writes its own asynchronously.
class GroupedSink final : public NamedSink {
 public:
  GroupedSink() : NamedSink("eos") {}
  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    return std::vector<Outcome>(events.size(), Outcome::delivered());
  }
  int lane_groups() const override { return 1; }
};

TEST_CASE("with a sink that keeps progress downstream, a poll never carries outcomes: they are written first, apart") {
  Fixture f;
  f.options.outcome_delay = milliseconds(0);  // every poll would carry the previous one's outcomes
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "x")});
  GroupedSink eos;
  auto loop = f.make(f.one, {&eos});
  const DrainControl poll = polling();
  CHECK(loop.drain(poll).delivered == 2);
  CHECK(loop.drain(poll).delivered == 1);
  loop.drain(poll);
  REQUIRE(f.store.carried.size() == 3);
  for (const auto& carried : f.store.carried) CHECK(carried.empty());
  // Batch 1's outcomes were written (complete) before the poll that claimed 3, batch 2's before the third.
  CHECK(f.store.written_at_claim == std::vector<std::size_t>{0, 2, 3});
  CHECK(f.store.of(3).kind == Kind::kDelivered);
  CHECK_FALSE(loop.has_pending());
}

TEST_CASE("polls leave delivered outcomes to a later poll for up to outcome_delay, then write them together") {
  Fixture f;
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "x")});
  auto loop = f.one_sink();
  const DrainControl poll = polling();
  CHECK(loop.drain(poll).delivered == 2);
  f.clock.t += milliseconds(5);
  CHECK(loop.drain(poll).delivered == 1);
  f.clock.t += milliseconds(49);  // 49 ms after the poll that first left outcomes (the second)
  loop.drain(poll);
  CHECK(f.store.completed.empty());
  CHECK(loop.has_pending());
  f.clock.t += milliseconds(1);
  loop.drain(poll);  // finds nothing: writes them at once
  REQUIRE(f.store.carried.size() == 4);
  for (const auto& c : f.store.carried) CHECK(c.empty());  // no poll carried them
  REQUIRE(f.store.completed.size() == 3);                  // the three events' outcomes, in one statement
  for (EventId id : {1, 2, 3}) CHECK(f.store.of(id).kind == Kind::kDelivered);
  CHECK_FALSE(loop.has_pending());
  f.clock.t += milliseconds(5);
  loop.drain(poll);
  CHECK(f.store.carried[4].empty());
  CHECK(f.store.completed.size() == 3);  // each outcome written once
}

TEST_CASE("outcomes that came due are written beside the publishing of the poll's batch, not carried by it") {
  Fixture f;
  f.store.batches.push_back({event(1, "x")});
  f.store.batches.push_back({event(2, "y")});
  f.store.batches.push_back({event(3, "z")});
  auto loop = f.one_sink();
  const DrainControl poll = polling();
  loop.drain(poll);
  f.clock.t += milliseconds(5);
  loop.drain(poll);  // leaves 1 (from here on, 50 ms)
  f.clock.t += milliseconds(50);
  loop.drain(poll);  // claims 3; 1 and 2 are due
  REQUIRE(f.store.carried.size() == 3);
  for (const auto& c : f.store.carried) CHECK(c.empty());
  REQUIRE(f.store.completed.size() == 2);
  CHECK(f.store.written_at_claim == std::vector<std::size_t>{0, 0, 0});  // after the claim, not before
  CHECK(f.a.seen == std::vector<EventId>{1, 2, 3});
  CHECK(loop.has_pending());  // 3's outcome
}

TEST_CASE("a retry among a poll's outcomes is written by the next poll, with the outcomes left before it") {
  Fixture f;
  f.store.batches.push_back({event(1, "x")});
  f.store.batches.push_back({event(2, "y"), event(3, "z")});
  f.a.script[3] = Outcome::retry("503");
  auto loop = f.one_sink();
  const DrainControl poll = polling();
  loop.drain(poll);
  f.clock.t += milliseconds(5);
  loop.drain(poll);  // leaves 1; its own batch holds a retry
  f.clock.t += milliseconds(5);
  loop.drain(poll);
  REQUIRE(f.store.carried.size() == 3);
  CHECK(f.store.carried[1].empty());
  REQUIRE(f.store.carried[2].size() == 3);
  CHECK(f.store.of(3).kind == Kind::kRetry);
  CHECK(loop.next_retry_due().has_value());
  CHECK_FALSE(loop.has_pending());
}

TEST_CASE("outcomes polls left are written when batch_size of them pile up, and before a full claim") {
  Fixture f;
  f.options.batch_size = 3;
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "x")});
  f.store.batches.push_back({event(4, "y")});
  f.store.batches.push_back({event(5, "x")});
  auto loop = f.one_sink();
  const DrainControl poll = polling();
  loop.drain(poll);
  loop.drain(poll);
  loop.drain(poll);  // 1, 2 and 3 waiting: batch_size of them, written beside 4's publishing
  REQUIRE(f.store.carried.size() == 3);
  for (const auto& c : f.store.carried) CHECK(c.empty());
  CHECK(f.store.completed.size() == 3);
  CHECK(loop.has_pending());  // 4's outcome, left again
  loop.drain({});             // a full claim (sweep, wakeup) writes it before it claims
  CHECK(f.store.written_at_claim.back() == 4);
  CHECK(f.store.of(4).kind == Kind::kDelivered);
  CHECK(f.a.seen == std::vector<EventId>{1, 2, 3, 4, 5});
}

TEST_CASE("a poll that fills a batch goes on like a drain, claiming again only after its outcomes are written") {
  Fixture f;
  f.options.batch_size = 2;
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "x"), event(4, "y")});
  f.store.batches.push_back({event(5, "x")});
  auto loop = f.one_sink();
  const DrainControl poll = polling();
  CHECK(loop.drain(poll).delivered == 5);
  CHECK(f.store.probes == 1);  // only the first claim is a poll
  CHECK(f.store.claims == 3);
  CHECK(f.a.seen == std::vector<EventId>{1, 2, 3, 4, 5});
  // A poll's events carry no lease (Store::probe_claim): batch 2 is claimed only once batch 1's
  // outcomes are written, not beside its publishing. Batch 3 is claimed beside batch 2 (leased),
  // before batch 2's outcomes; batch 3 (short) waits for the next poll.
  CHECK(f.store.written_at_claim == std::vector<std::size_t>{0, 2, 2});
  // Batch 2 is claimed above the poll's last id, not from the start of the pending index (a walk
  // through every entry delivered since the last vacuum), and batch 3 above batch 2.
  CHECK(f.store.floors == std::vector<long long>{0, 2, 4});
  REQUIRE(f.store.completed.size() == 4);
  CHECK(loop.has_pending());
  loop.flush_pending();
  CHECK(f.store.of(3).kind == Kind::kDelivered);
}

TEST_CASE("after a full poll with an event not delivered, the next claim looks from the start") {
  Fixture f;
  f.options.batch_size = 2;
  f.a.script[2] = Outcome::retry("500");
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "x"), event(4, "z")});
  auto loop = f.one_sink();
  loop.drain(polling());
  CHECK(f.store.floors == std::vector<long long>{0, 0, 0});
  CHECK(f.store.of(2).kind == Kind::kRetry);
}

TEST_CASE("a short poll that took a retry claims from the start at once, after writing its outcomes") {
  // The poll took event 1 (a retry another instance left due) and held back the later events of
  // its key; the next poll would look above every id it claimed and let a later event of that
  // key pass them. The drain claims from the start instead, once event 1's outcome is written.
  Fixture f;
  f.options.batch_size = 10;
  Event retried = event(1, "k");
  retried.attempts = 1;
  f.store.batches.push_back({retried, event(9, "z")});
  f.store.batches.push_back({event(2, "k"), event(3, "k")});
  auto loop = f.one_sink();
  loop.drain(polling());
  CHECK(f.store.probes == 1);
  CHECK(f.store.floors == std::vector<long long>{0, 0});  // the poll, then a claim from the start
  CHECK(f.store.written_at_claim.at(1) == 2);             // events 1 and 9 marked before it
}

TEST_CASE("a short poll without a retry leaves the next look to the next poll") {
  Fixture f;
  f.options.batch_size = 10;
  f.store.batches.push_back({event(1, "k"), event(9, "z")});
  f.store.batches.push_back({event(2, "k")});
  auto loop = f.one_sink();
  loop.drain(polling());
  CHECK(f.store.claims == 1);
}

TEST_CASE("a poll that loses its session keeps the outcomes it carried for the next call") {
  Fixture f;
  f.store.batches.push_back({event(1, "x")});
  auto loop = f.one_sink();
  const DrainControl poll = polling();
  loop.drain(poll);
  f.store.fail_probes = 1;
  CHECK_THROWS_AS(loop.drain(poll), StoreUnavailable);
  CHECK(loop.has_pending());
  loop.drain({});  // a full drain (after a reconnect) writes them first
  CHECK(f.store.of(1).kind == Kind::kDelivered);
  CHECK(f.a.seen == std::vector<EventId>{1});
}

TEST_CASE("a retry from a poll is timed from when a later call wrote it") {
  Fixture f;
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.a.script[1] = Outcome::retry("503");
  auto loop = f.one_sink();
  const DrainControl poll = polling();
  const auto r = loop.drain(poll);
  CHECK(r.retried == 1);
  CHECK(r.delivered == 1);
  CHECK_FALSE(loop.next_retry_due().has_value());  // counted once the store wrote it
  loop.flush_pending();
  CHECK(f.store.of(1).kind == Kind::kRetry);
  REQUIRE(loop.next_retry_due().has_value());
}

TEST_CASE("a sink that throws on the first batch, while the second is claimed ahead, costs that batch a retry") {
  Fixture f;
  f.options.batch_size = 2;
  f.a.throws_at = 1;
  f.store.batches.push_back({event(1, "k"), event(2, "j")});  // full: the next is claimed ahead
  f.store.batches.push_back({event(3, "k"), event(4, "m")});
  f.store.batches.push_back({event(5, "x")});
  Router router({Route{{"order.*"}, {0, 1}}}, 2);
  auto loop = f.make(router, {&f.a, &f.b});
  BatchResult r;
  CHECK_NOTHROW(r = loop.drain({}));
  CHECK(f.store.of(1).kind == Kind::kRetry);
  CHECK(f.store.of(1).error == "a: publish threw: boom at 1");
  CHECK(f.store.of(1).sinks_done == std::vector<std::string>{"b"});  // b delivered it: not re-sent there
  CHECK(f.store.of(2).kind == Kind::kRetry);
  CHECK(f.store.of(3).kind == Kind::kRelease);  // claimed before 1's retry was written: waits for it
  CHECK(f.store.of(4).kind == Kind::kDelivered);
  CHECK(f.store.of(5).kind == Kind::kDelivered);
  CHECK(f.a.seen == std::vector<EventId>{4, 5});
  CHECK(f.b.seen == std::vector<EventId>{1, 2, 4, 5});
  CHECK(r.retried == 2);
  CHECK(r.delivered == 2);
  CHECK(f.store.completed.size() == 5);
  CHECK(f.metrics.retried_by["a"] == 2);
}

TEST_CASE("a sink that throws on a middle batch costs only that batch a retry; the drain goes on") {
  Fixture f;
  f.options.batch_size = 2;
  f.a.throws_other_at = 4;  // not even a std::exception
  f.store.batches.push_back({event(1, "k"), event(2, "j")});
  f.store.batches.push_back({event(3, "k"), event(4, "m")});
  f.store.batches.push_back({event(5, "m"), event(6, "k")});  // claimed ahead of batch 2's outcomes
  f.store.batches.push_back({event(7, "x")});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  CHECK_NOTHROW(loop.drain({}));
  CHECK(f.store.of(3).error == "a: publish threw: an exception that is not a std::exception");
  CHECK(f.store.of(4).kind == Kind::kRetry);
  CHECK(f.store.of(5).kind == Kind::kRelease);  // m waits for 4
  CHECK(f.store.of(6).kind == Kind::kRelease);  // k waits for 3
  CHECK(f.a.seen == std::vector<EventId>{1, 2, 7});
  CHECK(f.store.completed.size() == 7);
}

TEST_CASE("a sink that throws on a short batch, published on the drain's own thread, costs it a retry") {
  Fixture f;
  f.a.throws_at = 2;
  f.store.batches.push_back({event(1, "k"), event(2, "j")});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  CHECK_NOTHROW(loop.drain({}));
  CHECK(f.store.of(1).kind == Kind::kRetry);
  CHECK(f.store.of(2).error == "a: publish threw: boom at 2");
  CHECK_NOTHROW(loop.run_once());  // and the same through run_once
}

TEST_CASE("a sink's delivered answer behind a retry of its key is turned into a retry by the loop") {
  Fixture f;
  f.a.script[1] = Outcome::retry("500");  // the fake sink wrongly goes on delivering key k
  f.store.batches.push_back({event(1, "k"), event(2, "k"), event(3, "j")});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  loop.run_once();
  CHECK(f.store.of(1).kind == Kind::kRetry);
  CHECK(f.store.of(2).kind == Kind::kRetry);
  CHECK(f.store.of(2).error.find("earlier event of the same key") != std::string::npos);
  CHECK(f.store.of(3).kind == Kind::kDelivered);
}

// The sinks no longer apply hold_back_after_failures() themselves: the loop does, for every
// answer, also in a drain and behind a deferred event.
TEST_CASE("a drain turns a sink's delivered answer behind a retried or deferred event of its key into a retry") {
  Fixture f;
  f.options.batch_size = 4;
  f.a.script[1] = Outcome::retry("500");
  f.a.script[3] = Outcome::deferred();
  f.store.batches.push_back({event(1, "k"), event(2, "k"), event(3, "j"), event(4, "j")});
  Router router({}, 1);
  auto loop = f.make(router, {&f.a});
  loop.drain({});
  CHECK(f.store.of(1).kind == Kind::kRetry);
  CHECK(f.store.of(2).kind == Kind::kRetry);
  CHECK(f.store.of(2).error.find("earlier event of the same key") != std::string::npos);
  CHECK(f.store.of(4).kind == Kind::kRetry);
  CHECK(f.store.of(4).error.find("earlier event of the same key") != std::string::npos);
}

TEST_CASE("a retry that a poll's drain took in its claim from the start is marked before the next poll claims") {
  // relay2 in seed 1978975820: a poll's batch released events (another key failed), so the drain
  // claimed from the start; that full claim took 2602 (key k3, a due retry, attempts 1) and it was
  // delivered. The drain was a poll's, so the delivered outcome was left for outcome_delay. The
  // next polls' head-of-line rule saw 2602 still failed and pending and held back 2759 (k3) while
  // their lane bound moved past it; once 2602's mark was written, a poll took 2838 (k3) first.
  Fixture f;
  f.options.batch_size = 10;
  f.a.script[10] = Outcome::retry("503");
  f.a.script[11] = Outcome::deferred();
  f.store.batches.push_back({event(10, "x"), event(11, "x")});  // the poll: x fails, 11 released
  Event retried = event(1, "k");
  retried.attempts = 1;
  f.store.batches.push_back({retried, event(20, "z")});  // the claim from the start: k's due retry
  auto loop = f.one_sink();
  loop.drain(polling());
  REQUIRE(f.store.claims == 2);
  f.clock.t += milliseconds(6);  // the next poll, within outcome_delay
  loop.drain(polling());
  REQUIRE(f.store.claims == 3);
  bool marked = false;
  for (std::size_t i = 0; i < f.store.written_at_claim.back(); ++i) {
    const Completion& c = f.store.completed[i];
    if (c.id == 1 && c.kind == Kind::kDelivered) marked = true;
  }
  for (const auto& c : f.store.carried.back()) {
    if (c.id == 1 && c.kind == Kind::kDelivered) marked = true;
  }
  CHECK(marked);  // else the poll's head-of-line look sees event 1 as a retry still waiting
}

TEST_CASE("events a pipelined batch released are claimed again from the start though the last batch released none") {
  // Batch 1 (full) releases event 1 (a sink timeout's "not sent", or the deferred events behind a
  // long key's retry that the store dead-letters: nothing holds key L afterwards). Batch 2 was
  // claimed ahead above batch 1 while event 1 was still leased, so polls now look above it.
  Fixture f;
  f.options.batch_size = 2;
  f.a.script[1] = Outcome::deferred();
  f.store.batches.push_back({event(1, "L"), event(2, "m")});
  f.store.batches.push_back({event(3, "z")});
  auto loop = f.one_sink();
  loop.drain({});
  CHECK(f.store.claims == 3);  // a claim from the start after event 1's release is written
  CHECK(f.store.floors.back() == 0);
}

namespace {

class RecordingSpans final : public SpanSink {
 public:
  void submit(std::vector<SendSpan>& in) override {
    ++submits;
    for (auto& s : in) spans.push_back(std::move(s));
    in.clear();
  }
  bool root_spans() const override { return roots; }
  std::vector<SendSpan> spans;
  int submits = 0;
  bool roots = false;
};

Event traced(EventId id, const std::string& traceparent, std::string key = "k") {
  Event e = event(id, std::move(key));
  e.headers_json = R"({"traceparent":")" + traceparent + R"("})";
  return e;
}

const std::string kSampled = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
const std::string kUnsampled = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00";

}  // namespace

TEST_CASE("tracing: a span per attempted event in the row's trace, from claim to acknowledgement") {
  Fixture f;
  RecordingSpans spans;
  f.a.script[2] = Outcome::retry("HTTP 503: maintenance");
  f.a.script[3] = Outcome::deferred();  // the sink did not try it: no send, no span
  Event retried = traced(4, kSampled, "other");
  retried.attempts = 2;
  f.store.batches.push_back({traced(1, kSampled), traced(2, kSampled, "j"), traced(3, kSampled, "j"), retried,
                             traced(5, kUnsampled), event(6), traced(7, "not-a-traceparent")});
  auto loop = f.one_sink();
  loop.trace_to(&spans);
  f.clock.wall = 2'000'000;  // the claim and the acknowledgement read the same fake clock
  loop.run_once();
  // 5 has an unsampled parent; 6 and 7 no valid one.
  REQUIRE(spans.spans.size() == 3);
  CHECK(spans.submits == 1);  // one hand-over per sink call
  const SendSpan& first = spans.spans[0];
  CHECK(first.event_id == 1);
  CHECK(first.trace_id == parse_traceparent(kSampled)->trace_id);
  CHECK(first.parent_span_id == parse_traceparent(kSampled)->span_id);
  CHECK(first.start_us == 2'000'000);
  CHECK(first.end_us == 2'000'000);
  CHECK(first.created_at_us == 500'000);
  CHECK(first.attempt == 1);
  CHECK(first.sink == "a");
  CHECK(std::string(first.system) == "outbox-relay");  // the Sink default
  CHECK(first.destination == "order.paid");
  CHECK_FALSE(first.failed);
  const SendSpan& failed = spans.spans[1];
  CHECK(failed.event_id == 2);
  CHECK(failed.failed);
  CHECK(failed.error == "HTTP 503: maintenance");
  CHECK(spans.spans[2].event_id == 4);
  CHECK(spans.spans[2].attempt == 3);
}

TEST_CASE("tracing: root spans for rows without a valid traceparent only when asked; off, no span") {
  Fixture f;
  RecordingSpans spans;
  spans.roots = true;
  f.store.batches.push_back({event(1), traced(2, "garbage"), traced(3, kUnsampled)});
  auto loop = f.one_sink();
  loop.trace_to(&spans);
  loop.run_once();
  REQUIRE(spans.spans.size() == 2);
  for (const auto& s : spans.spans) {
    CHECK(s.trace_id == TraceId{});  // the exporter gives it a trace of its own
    CHECK(s.parent_span_id == SpanId{});
  }

  f.store.batches.push_back({traced(4, kSampled)});
  loop.trace_to(nullptr);
  loop.run_once();
  CHECK(spans.spans.size() == 2);
}

// Pipelined sinks (Sink::pipelined()): the next batch enters the sink before the previous one's
// outcomes are collected; an event whose key is still in the sink waits for them.

namespace {

// Records every submit() and collect() in `calls` ("s1,2" submitted ids 1 and 2; "c1,2" their
// outcomes collected) and answers with a scripted outcome per id at collect().
class PipelinedSink final : public NamedSink {
 public:
  explicit PipelinedSink(std::string name) : NamedSink(std::move(name)) {}
  bool pipelined() const override { return true; }
  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    submit(events);
    return collect();
  }
  void submit(std::span<const Event* const> events) override {
    std::vector<EventId> ids;
    for (const Event* e : events) ids.push_back(e->id);
    calls.push_back("s" + text(ids));
    queue.push_back(std::move(ids));
  }
  std::vector<Outcome> collect() override {
    REQUIRE(!queue.empty());
    const auto ids = std::move(queue.front());
    queue.pop_front();
    calls.push_back("c" + text(ids));
    std::vector<Outcome> out;
    for (EventId id : ids) {
      auto it = script.find(id);
      out.push_back(it == script.end() ? Outcome::delivered() : it->second);
    }
    return out;
  }
  static std::string text(const std::vector<EventId>& ids) {
    std::string out;
    for (EventId id : ids) out += (out.empty() ? "" : ",") + std::to_string(id);
    return out;
  }
  std::map<EventId, Outcome> script;
  std::vector<std::string> calls;
  std::deque<std::vector<EventId>> queue;
};

}  // namespace

TEST_CASE("pipelined: the next batch enters the sink before the previous batch's outcomes are collected") {
  Fixture f;
  f.options.batch_size = 2;
  PipelinedSink p{"p"};
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "z"), event(4, "w")});
  f.store.batches.push_back({event(5, "v")});
  auto loop = f.make(f.one, {&p});
  const auto r = loop.drain({});
  CHECK(r.delivered == 5);
  CHECK(p.calls == std::vector<std::string>{"s1,2", "s3,4", "c1,2", "s5", "c3,4", "c5"});
  CHECK(p.queue.empty());
  REQUIRE(f.store.completed.size() == 5);
  for (EventId id = 1; id <= 5; ++id) CHECK(f.store.of(id).kind == Kind::kDelivered);
}

TEST_CASE("pipelined: a batch that would pass the byte window with the one in flight waits for its outcomes") {
  Fixture f;
  f.options.batch_size = 2;
  f.options.in_flight_bytes = 100;  // an event of event() is 20 bytes: payload 7, key 1, topic 10, headers 2
  PipelinedSink p{"p"};
  Event big = event(6, "w");
  big.payload = "\"" + std::string(78, 'x') + "\"";           // 93 bytes
  f.store.batches.push_back({event(1, "x"), event(2, "y")});  // 40
  f.store.batches.push_back({event(3, "z"), event(4, "y")});  // 40: 80 with the one in flight, fits
  f.store.batches.push_back({event(5, "v"), big});            // 113: more than the window alone: in slices
  f.store.batches.push_back({event(7, "u")});                 // 20: nothing in flight (a sliced batch is not left)
  auto loop = f.make(f.one, {&p});
  const auto r = loop.drain({});
  CHECK(r.delivered == 7);
  // 4 (key y) waits for 2, as any key does; 5 and 6 wait for 3 and 4, then go one slice each.
  CHECK(p.calls ==
        std::vector<std::string>{"s1,2", "s3", "c1,2", "s4", "c3", "c4", "s5", "c5", "s6", "c6", "s7", "c7"});
  CHECK(p.queue.empty());
}

TEST_CASE("claims are bounded by the byte window, from the start and after a reload") {
  Fixture f;
  f.options.in_flight_bytes = 3 << 20;
  auto loop = f.make(f.one, {&f.a});
  CHECK(f.store.claim_bytes == std::vector<std::size_t>{3 << 20});
  LoopOptions reloaded = f.options;
  reloaded.in_flight_bytes = 5 << 20;
  loop.reconfigure({&f.a}, f.one, reloaded);
  CHECK(f.store.claim_bytes == std::vector<std::size_t>{3 << 20, 5 << 20});
}

TEST_CASE("a batch over the byte window goes in slices; a key that failed in one is released in the next") {
  Fixture f;
  f.options.batch_size = 5;
  f.options.in_flight_bytes = 50;  // two events of event() (20 bytes each) per slice
  PipelinedSink p{"p"};
  p.script[1] = Outcome::retry("LOADING");
  f.store.batches.push_back({event(1, "a"), event(2, "b"), event(3, "a"), event(4, "c"), event(5, "a")});
  auto loop = f.make(f.one, {&p});
  const auto r = loop.drain({});
  // Slices [1, 2], [3, 4], [5]: 3 and 5 (key a, after 1 failed) never reach the sink.
  CHECK(p.calls == std::vector<std::string>{"s1,2", "c1,2", "s4", "c4"});
  std::vector<Kind> kinds;
  for (EventId id = 1; id <= 5; ++id) kinds.push_back(f.store.of(id).kind);
  CHECK(kinds == std::vector<Kind>{Kind::kRetry, Kind::kDelivered, Kind::kRelease, Kind::kDelivered, Kind::kRelease});
  CHECK(r.delivered == 2);
  CHECK(r.released == 2);
}

TEST_CASE("a batch over the byte window goes in slices to an unpipelined sink too, and after the one in flight") {
  Fixture f;
  f.options.batch_size = 3;
  f.options.in_flight_bytes = 70;
  PipelinedSink p{"p"};
  p.script[2] = Outcome::retry("LOADING");
  const auto heavy = [](EventId id, std::string key) {
    Event e = event(id, std::move(key));
    e.payload += std::string(10, ' ');  // 30 bytes
    return e;
  };
  f.store.batches.push_back({event(1, "a"), event(2, "b"), event(3, "c")});  // 60: left in the sink
  f.store.batches.push_back({heavy(4, "b"), heavy(5, "d"), heavy(6, "e")});  // 90: in slices, after [1, 3]
  auto loop = f.make(f.one, {&p});
  loop.drain({});
  // 4 (key b) waits for 2, which failed: released. Slices [4, 5] and [6].
  CHECK(p.calls == std::vector<std::string>{"s1,2,3", "c1,2,3", "s5", "c5", "s6", "c6"});
  CHECK(f.store.of(4).kind == Kind::kRelease);
  CHECK(f.store.of(6).kind == Kind::kDelivered);

  Fixture g;
  g.options.batch_size = 3;
  g.options.in_flight_bytes = 50;
  FakeSink plain{"plain"};
  g.store.batches.push_back({event(1, "a"), event(2, "b"), event(3, "c")});
  auto unpipelined = g.make(g.one, {&plain});
  unpipelined.drain({});
  CHECK(plain.seen == std::vector<EventId>{1, 2, 3});
  CHECK(plain.sizes == std::vector<std::size_t>{2, 1});
}

TEST_CASE("pipelined: an event whose key is in flight waits for it, and is released if it failed") {
  Fixture f;
  f.options.batch_size = 3;
  PipelinedSink p{"p"};
  p.script[10] = Outcome::retry("LOADING");
  f.store.batches.push_back({event(10, "k"), event(11, "j"), event(12, "m")});
  // 13 (k) waits for 10 and is released; 14 (j) waits for 11 and goes in after it; 15 (n) at once.
  f.store.batches.push_back({event(13, "k"), event(14, "j"), event(15, "n")});
  f.store.batches.push_back({event(16, "q")});
  auto loop = f.make(f.one, {&p});
  const auto r = loop.drain({});
  CHECK(p.calls == std::vector<std::string>{"s10,11,12", "s15", "c10,11,12", "s14", "s16", "c15", "c14", "c16"});
  CHECK(f.store.of(10).kind == Kind::kRetry);
  CHECK(f.store.of(13).kind == Kind::kRelease);
  CHECK(f.store.of(14).kind == Kind::kDelivered);
  CHECK(f.store.of(15).kind == Kind::kDelivered);
  CHECK(f.store.of(16).kind == Kind::kDelivered);
  CHECK(r.retried == 1);
  CHECK(r.released == 1);
}

TEST_CASE("pipelined: a dead-lettered event also holds back the later events of its key in flight behind it") {
  Fixture f;
  f.options.batch_size = 2;
  PipelinedSink p{"p"};
  p.script[1] = Outcome::permanent("WRONGTYPE");
  f.store.batches.push_back({event(1, "k"), event(2, "j")});
  f.store.batches.push_back({event(3, "k"), event(4, "j")});
  f.store.batches.push_back({event(5, "z")});
  f.store.batches.push_back({event(3, "k")});  // claimable again after its release
  auto loop = f.make(f.one, {&p});
  loop.drain({});
  CHECK(f.store.of(1).kind == Kind::kDeadLetter);
  CHECK(f.store.completed[2].id == 3);  // batch 2's outcomes: 3 released, 4 delivered
  CHECK(f.store.completed[2].kind == Kind::kRelease);
  CHECK(p.calls == std::vector<std::string>{"s1,2", "c1,2", "s4", "s5", "c4", "c5", "s3", "c3"});
}

TEST_CASE("pipelined: a stop collects the batch in the sink and hands back the batch claimed ahead") {
  Fixture f;
  f.options.batch_size = 1;
  PipelinedSink p{"p"};
  for (EventId id = 1; id <= 5; ++id) f.store.batches.push_back({event(id, "k" + std::to_string(id))});
  auto loop = f.make(f.one, {&p});
  DrainControl control;
  control.stop = [&] { return f.store.claims == 3; };
  loop.drain(control);
  CHECK(p.calls == std::vector<std::string>{"s1", "s2", "c1", "c2"});
  CHECK(p.queue.empty());
  CHECK(f.store.of(1).kind == Kind::kDelivered);
  CHECK(f.store.of(2).kind == Kind::kDelivered);
  CHECK(f.store.of(3).kind == Kind::kRelease);
}

TEST_CASE("pipelined: with a sink that is not pipelined, every batch is published as before") {
  Fixture f;
  f.options.batch_size = 2;
  PipelinedSink p{"p"};
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "z"), event(4, "w")});
  f.store.batches.push_back({event(5, "v")});
  Router both({}, 2);  // every topic to both
  auto loop = f.make(both, {&p, &f.a});
  CHECK(loop.drain({}).delivered == 5);
  CHECK(p.calls == std::vector<std::string>{"s1,2", "c1,2", "s3,4", "c3,4", "s5", "c5"});
  CHECK(f.a.seen == std::vector<EventId>{1, 2, 3, 4, 5});
}

TEST_CASE("pipelined: the session lost beside a batch in the sink keeps every outcome for the next call") {
  Fixture f;
  f.options.batch_size = 2;
  PipelinedSink p{"p"};
  f.store.batches.push_back({event(1, "x"), event(2, "y")});
  f.store.batches.push_back({event(3, "z"), event(4, "w")});
  f.store.batches.push_back({event(5, "v"), event(6, "u")});
  f.store.batches.push_back({event(7, "t"), event(8, "s")});
  auto loop = f.make(f.one, {&p});
  // Batch 1's outcomes (settled beside batch 2) are written beside batch 3 entering the sink and
  // batch 4's claim: that write fails.
  f.store.fail_completes = 1;
  CHECK_THROWS_AS(loop.drain({}), StoreUnavailable);
  CHECK(p.queue.empty());  // batch 3 was collected before the drain gave up
  CHECK(p.calls == std::vector<std::string>{"s1,2", "s3,4", "c1,2", "s5,6", "c3,4", "c5,6"});
  CHECK(f.store.completed.empty());
  loop.drain({});  // writes every outcome, batch 4 released
  REQUIRE(f.store.completed.size() == 8);
  for (EventId id = 1; id <= 6; ++id) CHECK(f.store.of(id).kind == Kind::kDelivered);
  CHECK(f.store.of(7).kind == Kind::kRelease);
  CHECK(f.store.of(8).kind == Kind::kRelease);
}
