// The runner's schedule against a fake store, a fake clock and a fake waiter that moves the clock
// to each deadline: one thread, no sleeps. The loop is the real RelayLoop.
#include <doctest/doctest.h>

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "core/runner.hpp"
#include "support/clock.hpp"
#include "support/options.hpp"

using namespace outbox;
using std::chrono::milliseconds;
using Time = Clock::SteadyTime;

namespace {

using outbox::testing::FakeClock;

Time at(long long ms) { return Time{} + milliseconds(ms); }
long long ms_of(Time t) { return std::chrono::duration_cast<milliseconds>(t - Time{}).count(); }

// Waiting moves the fake clock to the deadline, or to the next scripted ring before it. Stops
// once time would reach stop_at.
class FakeWaiter final : public Waiter {
 public:
  explicit FakeWaiter(FakeClock& clock) : clock_(clock) {}
  bool stopped() const override { return stopped_; }
  std::optional<WakeSource> wait_until(Time deadline) override {
    if (++calls > 1'000'000) FAIL("the runner spins");
    Time next = deadline;
    if (!rings.empty()) next = std::min(next, rings.begin()->first);
    if (next >= stop_at) return stop();
    clock_.t = std::max(clock_.t, next);
    if (!rings.empty() && rings.begin()->first <= clock_.t) {
      const auto source = rings.begin()->second;
      rings.erase(rings.begin());
      if (source == WakeSource::kWatch) {  // as Bell::ring_watch: only for an offer in force, which it ends
        if (!offer) {
          ++stale_watch_rings;
          return std::nullopt;
        }
        offer.reset();
      }
      return source;
    }
    return std::nullopt;
  }
  bool sleep_until(Time deadline) override {
    sleeps.push_back(deadline - clock_.t);
    if (deadline >= stop_at) {
      stop();
      return false;
    }
    clock_.t = deadline;
    return true;
  }
  void clear() override {
    while (!rings.empty() && rings.begin()->first <= clock_.t) rings.erase(rings.begin());
  }
  bool offer_watch(long long after) override {
    if (!watcher) return false;
    if (offer != after) offers.emplace_back(clock_.t, after);
    offer = after;
    return true;
  }
  void withdraw_watch() override { offer.reset(); }

  std::multimap<Time, WakeSource> rings;
  Time stop_at = at(60'000);
  std::vector<Clock::SteadyTime::duration> sleeps;  // each backoff sleep
  long calls = 0;
  bool watcher = false;                            // takes offers of the idle watch
  std::optional<long long> offer;                  // the one in force
  std::vector<std::pair<Time, long long>> offers;  // each new one, when made
  int stale_watch_rings = 0;                       // kWatch rings dropped: no offer in force

 private:
  std::nullopt_t stop() {
    clock_.t = std::max(clock_.t, stop_at);
    stopped_ = true;
    return std::nullopt;
  }
  FakeClock& clock_;
  bool stopped_ = false;
};

Event event(EventId id) {
  Event e;
  e.id = id;
  e.topic = "order.paid";
  e.key = "k" + std::to_string(id);
  e.payload = "{}";
  e.headers_json = "{}";
  e.created_at = "2026-11-30T06:32:22.123456Z";
  return e;
}

// Records when each claim (a full drain) and poll ran; failures are scripted per call.
class FakeStore final : public Store {
 public:
  explicit FakeStore(const FakeClock& clock) : clock_(clock) {}
  void connect() override {
    ++connects;
    if (!connect_failures.empty()) {
      const auto kind = connect_failures.front();
      connect_failures.pop_front();
      throw StoreUnavailable("connect failed", kind, "do something");
    }
  }
  bool rebalance() override {
    rebalances.push_back(clock_.t);
    return gain_at_rebalance.count(rebalances.size()) > 0;
  }
  std::vector<Event> claim(std::size_t /*limit*/) override {
    claims.push_back(clock_.t);
    auto batch = next_batch();
    std::erase_if(foreign_retries, [&](const auto& r) {
      if (r.first > clock_.t || r.second > clock_.t) return false;
      batch.push_back(event(1000 + static_cast<EventId>(ms_of(r.second))));
      return true;
    });
    return batch;
  }
  std::optional<milliseconds> retry_due_in() override {
    retry_looks.push_back(clock_.t);
    std::optional<Time> due;
    for (const auto& [visible, at] : foreign_retries) {
      if (visible <= clock_.t && at > clock_.t && (!due || at < *due)) due = at;
    }
    if (!due) return std::nullopt;
    return std::chrono::duration_cast<milliseconds>(*due - clock_.t);
  }
  std::vector<Event> probe_claim(std::size_t /*limit*/, std::span<const Completion> c) override {
    probes.push_back(clock_.t);
    if (fail_probe_at.count(probes.size())) {
      unwritten_at_failure.push_back(unwritten.size());
      failed_open = failures_leave_session_open;
      throw StoreUnavailable(failed_open ? "canceling statement due to user request" : "connection lost");
    }
    complete(c);
    if (per_second > 0) {  // a steady stream: what arrived since the last poll
      const auto arrived = static_cast<EventId>(per_second * std::chrono::duration<double>(clock_.t - Time{}).count());
      std::vector<Event> batch;
      for (; streamed < arrived; ++streamed) {
        batch.push_back(event(streamed + 1));
        unwritten.insert(streamed + 1);
      }
      return batch;
    }
    if (event_at && clock_.t >= *event_at) {
      event_at.reset();
      return {event(99)};
    }
    return next_batch();
  }
  bool failed_session_open() const override { return failed_open; }
  void close_failed_session() override {
    unwritten_at_close.push_back(unwritten.size());
    failed_open = false;
  }
  void complete(std::span<const Completion> c) override {
    completed.insert(completed.end(), c.begin(), c.end());
    for (const Completion& done : c) unwritten.erase(done.id);
  }
  std::optional<long long> sweep_upto() const override {
    // With a stream: everything polled so far and more (ids drawn in other lanes, say).
    if (sweep_range && per_second > 0) return streamed + *sweep_range;
    return sweep_range;
  }
  std::optional<long long> first_claimable(long long after, long long upto) override {
    looks.emplace_back(after, upto);
    // Never an event in flight in the loop (polled, its outcome not yet written): it would look
    // claimable (a poll writes no lease).
    if (!unwritten.empty() && upto >= *unwritten.begin()) looked_at_unwritten = true;
    const auto it = claimable.upper_bound(after);
    if (it == claimable.end() || *it > upto) return std::nullopt;
    return *it;
  }
  bool waiting_for_writers() const override { return fenced; }
  std::optional<long long> watch_from() const override { return watch_id; }
  bool reading_pending() const override { return reading; }

  std::vector<Event> next_batch() {
    if (batches.empty()) return {};
    auto batch = std::move(batches.front());
    batches.pop_front();
    return batch;
  }

  std::deque<std::vector<Event>> batches;
  std::deque<DbErrorClass> connect_failures;
  std::set<std::size_t> gain_at_rebalance;  // 1-based rebalance calls that gain lanes
  std::set<std::size_t> fail_probe_at;      // 1-based polls that lose the session
  bool fenced = false;
  std::optional<long long> watch_id;  // Store::watch_from
  std::optional<Time> event_at;       // the first poll from then on finds one event
  bool reading = false;               // Store::reading_pending
  double per_second = 0;              // > 0: polls find a steady stream of this many events a second
  EventId streamed = 0;
  int connects = 0;
  bool failures_leave_session_open = false;       // a failed poll: a statement failed, the session stays
  bool failed_open = false;                       // Store::failed_session_open
  std::vector<std::size_t> unwritten_at_failure;  // events polled, outcomes not written: at each failed poll
  std::vector<std::size_t> unwritten_at_close;    // and at each close_failed_session()
  // Retries another instance scheduled: (visible from, due); visible once this one has the lanes.
  std::vector<std::pair<Time, Time>> foreign_retries;
  std::vector<Time> claims, probes, rebalances, retry_looks;
  std::optional<long long> sweep_range;                // Store::sweep_upto; nullopt: sweeps are full drains
  std::set<long long> claimable;                       // ids a sweep's look finds below it
  std::vector<std::pair<long long, long long>> looks;  // each first_claimable(after, upto)
  std::set<EventId> unwritten;                         // polled, their outcomes not yet written
  bool looked_at_unwritten = false;
  std::vector<Completion> completed;

 private:
  const FakeClock& clock_;
};

class RetryingSink final : public NamedSink {
 public:
  RetryingSink() : NamedSink("a") {}
  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    std::vector<Outcome> out;
    for (const Event* e : events) {
      out.push_back(retry_ids.count(e->id) ? Outcome::retry("busy") : Outcome::delivered());
      retry_ids.erase(e->id);  // once
    }
    return out;
  }
  std::set<EventId> retry_ids;
};

class CountingMetrics final : public Metrics {
 public:
  void wakeup(WakeSource source) override { ++wakeups[source]; }
  void reconnected() override { ++reconnects; }
  void db_error(DbErrorClass kind) override { ++db_errors[kind]; }
  std::map<WakeSource, int> wakeups;
  std::map<DbErrorClass, int> db_errors;
  int reconnects = 0;
};

struct Fixture {
  FakeClock clock;
  FakeWaiter waiter{clock};
  FakeStore store{clock};
  RetryingSink sink;
  CountingMetrics metrics;
  Health health;
  Router router{{}, 1};
  RelayLoop loop{store,
                 {&sink},
                 router,
                 clock,
                 metrics,
                 outbox::testing::loop_options(500, 5, {milliseconds(100), milliseconds(1000)}),
                 [] { return 0.0; }};
  RunnerOptions options = outbox::testing::default_runner_options();

  Fixture() {
    options.sweep_interval = milliseconds(30'000);
    options.rebalance_interval = milliseconds(5'000);
    options.poll_interval = milliseconds(5);
    options.light_poll_interval = milliseconds(5);  // off; the linger tests turn it on
    options.idle_poll_interval = milliseconds(100);
    options.idle_after = milliseconds(2'000);
    options.reconnect = {milliseconds(500), milliseconds(30'000)};
  }
  void run() {
    Runner runner(loop, store, waiter, clock, metrics, health, options, [] { return 0.0; });
    runner.run();
  }
};

std::vector<long long> ms_list(const std::vector<Time>& times) {
  std::vector<long long> out;
  for (Time t : times) out.push_back(ms_of(t));
  return out;
}

}  // namespace

TEST_CASE("runner: catches up at start, then a sweep drains every sweep_interval") {
  Fixture f;
  f.waiter.stop_at = at(65'000);
  f.run();
  CHECK(ms_list(f.store.claims) == std::vector<long long>{0, 30'000, 60'000});
  CHECK(f.metrics.wakeups[WakeSource::kSweep] == 2);
  CHECK(f.health.loop_running.load() == false);
  CHECK(f.health.store_up.load());
}

TEST_CASE("runner: a sweep with a known range looks at it in widening steps and drains only if it finds an event") {
  Fixture f;
  f.store.sweep_range = 100'000;
  f.waiter.stop_at = at(65'000);
  f.run();
  CHECK(ms_list(f.store.claims) == std::vector<long long>{0});  // the catch-up at start only
  CHECK(f.metrics.wakeups[WakeSource::kSweep] == 0);
  // Each sweep: 10,000 ids, then twice as many each step (the fake store answers at once), to 100,000.
  const std::vector<std::pair<long long, long long>> one{
      {0, 10'000}, {10'000, 30'000}, {30'000, 70'000}, {70'000, 100'000}};
  std::vector<std::pair<long long, long long>> two = one;
  two.insert(two.end(), one.begin(), one.end());
  CHECK(f.store.looks == two);

  SUBCASE("an event below the range's end: the sweep drains at once, from the start") {
    Fixture g;
    g.store.sweep_range = 100'000;
    g.store.claimable = {45'000};
    g.waiter.stop_at = at(35'000);
    g.run();
    CHECK(ms_list(g.store.claims) == std::vector<long long>{0, 30'000});
    CHECK(g.metrics.wakeups[WakeSource::kSweep] == 1);
    CHECK(g.store.looks.size() == 3);  // it stopped at the step that found it
  }
}

TEST_CASE("runner: a sweep beside a steady stream never looks at events whose outcomes are not written") {
  Fixture f;
  f.store.sweep_range = 1'000;  // sweep_upto: every event polled so far, and 1,000 ids more
  f.store.per_second = 2'000;   // 10 per poll: their delivered outcomes wait up to outcome_delay
  f.waiter.stop_at = at(95'000);
  f.run();
  REQUIRE(f.store.looks.size() >= 3);  // a sweep at 30, 60 and 90 s
  CHECK_FALSE(f.store.looked_at_unwritten);
  CHECK(f.metrics.wakeups[WakeSource::kSweep] == 0);
  CHECK(ms_list(f.store.claims) == std::vector<long long>{0});
  // Each sweep ended just below the outcomes still unwritten (the last poll's, at most
  // outcome_delay old), near what was polled when it started: 60,000 events at 30 s.
  for (const auto& [after, upto] : f.store.looks) CHECK(upto < 180'000);
  CHECK(f.store.looks.back().second > 180'000 - 100);
}

TEST_CASE("runner: idle polls slow down by half each poll to idle_poll_interval") {
  Fixture f;
  f.waiter.stop_at = at(3'000);
  f.run();
  const auto polls = ms_list(f.store.probes);
  REQUIRE(polls.size() > 10);
  // Every 5 ms until idle_after (2 s) without events ...
  CHECK(polls[0] == 5);
  CHECK(polls[1] == 10);
  CHECK(std::count_if(polls.begin(), polls.end(), [](long long t) { return t <= 2'000; }) == 400);
  // ... then 7, 10, 15, ... ms apart, up to 100 ms.
  std::vector<long long> gaps;
  for (std::size_t i = 1; i < polls.size(); ++i) gaps.push_back(polls[i] - polls[i - 1]);
  CHECK(gaps[399] == 7);
  CHECK(gaps[400] == 10);
  CHECK(gaps.back() == 100);
  CHECK(f.store.claims.size() == 1);  // only the catch-up: polls are not drains
}

TEST_CASE("runner: idle, with a watcher, it offers the watch, polls once a second, and a watch ring drains") {
  Fixture f;
  f.waiter.watcher = true;
  f.store.watch_id = 41;
  f.waiter.rings.emplace(at(4'321), WakeSource::kWatch);
  f.waiter.stop_at = at(7'000);
  f.run();
  // Offered once polls reached idle_poll_interval (2 s of nothing, then 7, 10, ... 100 ms apart).
  REQUIRE(!f.waiter.offers.empty());
  const long long first_offer = ms_of(f.waiter.offers.front().first);
  CHECK(first_offer > 2'000);
  CHECK(first_offer < 2'500);
  for (const auto& [when, after] : f.waiter.offers) CHECK(after == 41);
  // From then on a poll a second, counted from the last poll or drain.
  const auto polls = ms_list(f.store.probes);
  std::vector<long long> later;
  for (long long t : polls) {
    if (t > first_offer) later.push_back(t);
  }
  const long long last_before =
      *std::find_if(polls.rbegin(), polls.rend(), [&](long long t) { return t <= first_offer; });
  CHECK(later == std::vector<long long>{last_before + 1'000, last_before + 2'000, 5'321, 6'321});
  // The ring: a drain at once.
  CHECK(ms_list(f.store.claims) == std::vector<long long>{0, 4'321});
  CHECK(f.metrics.wakeups[WakeSource::kWatch] == 1);
  CHECK(f.metrics.wakeups[WakeSource::kPoll] == 0);
}

TEST_CASE("runner: watched, with a reading of open writers pending, the safety poll is a claim") {
  Fixture f;
  f.waiter.watcher = true;
  f.store.watch_id = 41;
  f.store.reading = true;
  f.waiter.stop_at = at(6'000);
  f.run();
  REQUIRE(!f.waiter.offers.empty());
  const long long first_offer = ms_of(f.waiter.offers.front().first);
  const auto claims = ms_list(f.store.claims);
  REQUIRE(claims.size() >= 4);
  CHECK(claims[0] == 0);
  CHECK(claims[1] > first_offer);
  for (std::size_t i = 2; i < claims.size(); ++i) CHECK(claims[i] - claims[i - 1] == 1'000);
  CHECK(ms_of(f.store.probes.back()) <= first_offer);  // no polls once watched
}

TEST_CASE("runner: no watch while events flow or the store cannot say from where; polls as before") {
  SUBCASE("store without a watch point") {
    Fixture f;
    f.waiter.watcher = true;
    f.waiter.stop_at = at(3'000);
    f.run();
    CHECK(f.waiter.offers.empty());
    const auto polls = ms_list(f.store.probes);
    REQUIRE(polls.size() > 10);
    CHECK(polls.back() - polls[polls.size() - 2] == 100);
  }
  SUBCASE("a steady stream") {
    Fixture f;
    f.waiter.watcher = true;
    f.store.watch_id = 7;
    f.store.per_second = 200;
    f.waiter.rings.emplace(at(1'000), WakeSource::kWatch);  // a watch from before, seeing an id late
    f.waiter.stop_at = at(3'000);
    f.run();
    CHECK(f.waiter.offers.empty());
    CHECK(f.waiter.stale_watch_rings == 1);
    CHECK(f.store.claims.size() == 1);    // the catch-up only
    CHECK(f.store.probes.size() == 599);  // every 5 ms
  }
  SUBCASE("events flow again: the offer is withdrawn") {
    Fixture f;
    f.waiter.watcher = true;
    f.store.watch_id = 7;
    f.store.event_at = at(4'000);  // found by the safety poll after it
    f.waiter.stop_at = at(5'000);
    f.run();
    REQUIRE(f.waiter.offers.size() == 1);
    CHECK_FALSE(f.waiter.offer.has_value());
    const auto polls = ms_list(f.store.probes);
    const auto found = std::find_if(polls.begin(), polls.end(), [](long long t) { return t >= 4'000; });
    REQUIRE(polls.end() - found > 10);
    CHECK(*(found + 1) - *found == 5);  // polled every 5 ms again
  }
  SUBCASE("no watcher (none connected, a notifying trigger, idle_watch off)") {
    Fixture f;
    f.store.watch_id = 7;
    f.waiter.stop_at = at(3'000);
    f.run();
    CHECK(f.waiter.offers.empty());
    const auto polls = ms_list(f.store.probes);
    CHECK(polls.back() - polls[polls.size() - 2] == 100);
  }
}

TEST_CASE("runner: while a claim is fenced by an open writer, polls stay at poll_interval") {
  Fixture f;
  f.store.fenced = true;
  f.waiter.stop_at = at(3'000);
  f.run();
  const auto polls = ms_list(f.store.probes);
  REQUIRE(polls.size() == 599);  // 5, 10, ..., 2995
  for (std::size_t i = 1; i < polls.size(); ++i) REQUIRE(polls[i] - polls[i - 1] == 5);
}

// The gaps between polls of a steady stream of `per_second` events, after the first second.
std::vector<long long> poll_gaps_at(double per_second, milliseconds light_poll_interval = milliseconds(8),
                                    int light_poll_events = 8) {
  Fixture f;
  f.options.light_poll_interval = light_poll_interval;
  f.options.light_poll_events = light_poll_events;
  f.store.per_second = per_second;
  f.waiter.stop_at = at(2'000);
  f.run();
  const auto polls = ms_list(f.store.probes);
  std::vector<long long> gaps;
  for (std::size_t i = 1; i < polls.size(); ++i) {
    if (polls[i - 1] >= 1'000) gaps.push_back(polls[i] - polls[i - 1]);
  }
  REQUIRE(gaps.size() > 50);
  CHECK(f.store.streamed ==
        static_cast<EventId>(per_second * static_cast<double>(ms_of(f.store.probes.back())) / 1000));
  return gaps;
}

TEST_CASE("runner: a light stream is polled up to light_poll_interval apart, a dense one every poll_interval") {
  for (long long g : poll_gaps_at(200)) REQUIRE(g == 8);    // 8 events would take 40 ms
  for (long long g : poll_gaps_at(1'000)) REQUIRE(g == 8);  // 8 ms: about 8 a poll
  for (long long g : poll_gaps_at(5'000)) REQUIRE(g == 5);  // 25 a poll at poll_interval
  // In between: about 8 a poll (8 events in 6.4 ms at 1,250/s), in whole milliseconds.
  for (long long g : poll_gaps_at(1'250)) REQUIRE((g == 6 || g == 7));
}

TEST_CASE("runner: light_poll_events sets what a poll of a light stream carries, within light_poll_interval") {
  for (long long g : poll_gaps_at(1'000, milliseconds(16), 16)) REQUIRE(g == 16);               // 16 a poll
  for (long long g : poll_gaps_at(1'000, milliseconds(16), 12)) REQUIRE((g == 12 || g == 13));  // whole ms
  for (long long g : poll_gaps_at(1'000, milliseconds(10), 16)) REQUIRE(g == 10);  // capped by the interval
  for (long long g : poll_gaps_at(500, milliseconds(16), 4)) REQUIRE(g == 8);
}

TEST_CASE("runner: with light_poll_interval equal to poll_interval, a light stream is polled every poll_interval") {
  Fixture f;
  f.store.per_second = 200;
  f.waiter.stop_at = at(500);
  f.run();
  const auto polls = ms_list(f.store.probes);
  REQUIRE(polls.size() == 99);
  for (std::size_t i = 1; i < polls.size(); ++i) REQUIRE(polls[i] - polls[i - 1] == 5);
}

TEST_CASE("runner: a due retry drains at once, without waiting for a poll or a sweep") {
  Fixture f;
  f.options.idle_poll_interval = milliseconds(10'000);
  f.options.poll_interval = milliseconds(10'000);
  f.store.batches.push_back({event(1)});
  f.sink.retry_ids = {1};
  f.waiter.stop_at = at(1'000);
  f.run();
  // Backoff 100 ms with jitter 0: 50 ms, plus the loop's 20 ms slack, counted from the complete at 0.
  CHECK(ms_list(f.store.claims) == std::vector<long long>{0, 70});
  CHECK(f.metrics.wakeups[WakeSource::kRetry] == 1);
  REQUIRE(f.store.completed.size() == 1);
  CHECK(f.store.completed[0].kind == Completion::Kind::kRetry);
}

TEST_CASE("runner: a retry another instance scheduled drains when due, found at start and when lanes are gained") {
  Fixture f;
  f.options.idle_poll_interval = milliseconds(10'000);
  f.options.poll_interval = milliseconds(10'000);
  f.store.gain_at_rebalance = {2};  // at 5 s
  f.store.foreign_retries = {{at(0), at(2'500)}, {at(5'000), at(7'000)}, {at(5'000), at(8'000)}};
  f.waiter.stop_at = at(20'000);
  f.run();
  // Each one at its time plus the 20 ms slack, not at the sweep (30 s) or a poll (10 s).
  CHECK(ms_list(f.store.claims) == std::vector<long long>{0, 2'520, 5'000, 7'020, 8'020});
  CHECK(f.store.foreign_retries.empty());
  CHECK(f.metrics.wakeups[WakeSource::kRetry] == 3);
  // Looked for at start, after each retry's drain, and when lanes were gained: not per poll.
  CHECK(ms_list(f.store.retry_looks) == std::vector<long long>{0, 2'520, 5'000, 7'020, 8'020});
}

TEST_CASE("runner: a bell drains at once; lanes gained at a rebalance are drained at once") {
  Fixture f;
  f.options.poll_interval = milliseconds(10'000);
  f.options.idle_poll_interval = milliseconds(10'000);
  f.store.gain_at_rebalance = {3};  // at start, 5 s, then 10 s gains lanes
  f.waiter.rings.emplace(at(1'234), WakeSource::kNotify);
  f.waiter.stop_at = at(12'000);
  f.run();
  CHECK(ms_list(f.store.rebalances) == std::vector<long long>{0, 5'000, 10'000});
  CHECK(ms_list(f.store.claims) == std::vector<long long>{0, 1'234, 10'000});
  CHECK(f.metrics.wakeups[WakeSource::kNotify] == 1);
}

TEST_CASE("runner: a lost session reconnects with exponential backoff and catches up") {
  Fixture f;
  f.store.connect_failures = {DbErrorClass::kTransient, DbErrorClass::kTransient, DbErrorClass::kTransient};
  f.waiter.stop_at = at(10'000);
  f.run();
  // initial 500 ms doubling, equal jitter at 0: half of 500, 1000, 2000.
  REQUIRE(f.waiter.sleeps.size() == 3);
  CHECK(f.waiter.sleeps[0] == milliseconds(250));
  CHECK(f.waiter.sleeps[1] == milliseconds(500));
  CHECK(f.waiter.sleeps[2] == milliseconds(1'000));
  CHECK(f.store.connects == 4);
  CHECK(ms_list(f.store.rebalances).front() == 1'750);
  CHECK(ms_list(f.store.claims).front() == 1'750);  // caught up as soon as it was back
  CHECK(f.metrics.db_errors[DbErrorClass::kTransient] == 3);
  CHECK(f.metrics.reconnects == 1);
  CHECK(f.health.store_up.load());
}

TEST_CASE("runner: the backoff starts over after a session worked; a lost poll reconnects too") {
  Fixture f;
  f.store.fail_probe_at = {1, 2};  // the first two polls lose the session
  f.waiter.stop_at = at(5'000);
  f.run();
  REQUIRE(f.waiter.sleeps.size() == 2);
  CHECK(f.waiter.sleeps[0] == milliseconds(250));
  CHECK(f.waiter.sleeps[1] == milliseconds(250));  // not 500: the session in between worked
  CHECK(f.store.connects == 3);
  CHECK(f.metrics.reconnects == 2);
}

TEST_CASE("runner: a poll that fails in a stream: outcomes before the lanes of a session still open") {
  // A poll's events carry no lease: only the lanes of the session that claimed them keep them from
  // peers. A session that failed on a statement holds its lanes until it is closed (PgStore), so
  // the outcomes go first; written after it, a peer that took the lanes in between had sent those
  // events again (test_upgrade's migrate under load, from schema 8, saw 4).
  Fixture f;
  f.store.per_second = 1'000;
  f.store.fail_probe_at = {40};
  f.waiter.stop_at = at(2'000);
  SUBCASE("a statement failed, the session is open: its outcomes are written, then it is closed") {
    f.store.failures_leave_session_open = true;
    f.run();
    REQUIRE(f.store.unwritten_at_close.size() == 1);
    CHECK(f.store.unwritten_at_close[0] == 0);
  }
  SUBCASE("the session was lost: nothing to close, the next session writes the outcomes") {
    f.run();
    CHECK(f.store.unwritten_at_close.empty());
  }
  REQUIRE(f.store.unwritten_at_failure.size() == 1);
  CHECK(f.store.unwritten_at_failure[0] > 0);  // delivered, their outcomes delayed (outcome_delay)
  // Either way the backoff, a new session, and every outcome written in the end.
  CHECK(f.waiter.sleeps.size() == 1);
  CHECK(f.store.connects == 2);
  CHECK(f.metrics.reconnects == 1);
  CHECK(f.store.unwritten.empty());
}

TEST_CASE("runner: an error that needs an operator waits the cap at once, marks the class, recovers by itself") {
  Fixture f;
  f.store.connect_failures = {DbErrorClass::kPrivilege, DbErrorClass::kPrivilege};
  f.options.reconnect = {milliseconds(500), milliseconds(4'000)};
  SUBCASE("down while failing") {
    f.waiter.stop_at = at(3'000);
    f.run();
    REQUIRE(f.waiter.sleeps.size() == 2);              // the second ends past stop_at
    CHECK(f.waiter.sleeps[0] == milliseconds(2'000));  // the cap, with equal jitter at 0
    CHECK_FALSE(f.health.store_up.load());
    CHECK(f.health.store_error.load() == DbErrorClass::kPrivilege);
    CHECK(f.store.claims.empty());
  }
  SUBCASE("up once fixed") {
    f.waiter.stop_at = at(10'000);
    f.run();
    REQUIRE(f.waiter.sleeps.size() == 2);
    CHECK(f.waiter.sleeps[1] == milliseconds(2'000));
    CHECK(f.metrics.db_errors[DbErrorClass::kPrivilege] == 2);
    CHECK(f.metrics.reconnects == 1);
    CHECK(f.health.store_up.load());
    CHECK(ms_list(f.store.claims).front() == 4'000);
  }
}

TEST_CASE("reconnect_delay: exponential for transient and other, the cap at once when an operator must act") {
  const BackoffPolicy p{milliseconds(500), milliseconds(30'000)};
  CHECK(reconnect_delay(p, 1, DbErrorClass::kTransient, 0.0) == milliseconds(250));
  CHECK(reconnect_delay(p, 3, DbErrorClass::kOther, 1.0) == milliseconds(2'000));
  CHECK(reconnect_delay(p, 30, DbErrorClass::kTransient, 1.0) == milliseconds(30'000));
  for (auto kind : {DbErrorClass::kPrivilege, DbErrorClass::kUndefinedObject, DbErrorClass::kAuthentication,
                    DbErrorClass::kConfiguration}) {
    CHECK(reconnect_delay(p, 1, kind, 0.0) == milliseconds(15'000));
    CHECK(reconnect_delay(p, 1, kind, 1.0) == milliseconds(30'000));
  }
}

namespace {

// Records what it was sent; may run a hook before it answers (a reload posted from another thread
// while its batch is in flight).
class RecordingSink final : public NamedSink {
 public:
  explicit RecordingSink(std::string name) : NamedSink(std::move(name)) {}
  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    for (const Event* e : events) ids.push_back(e->id);
    if (on_publish) std::exchange(on_publish, nullptr)();
    return std::vector<Outcome>(events.size(), Outcome::delivered());
  }
  std::vector<EventId> ids;
  std::function<void()> on_publish;
};

}  // namespace

TEST_CASE("runner: a reconfiguration posted while a batch is in flight is taken once it is done, not during it") {
  Fixture f;
  f.options.sweep_interval = milliseconds(10'000);
  f.waiter.stop_at = at(25'000);
  RecordingSink old_sink("old"), new_sink("new");
  const Router router{{}, 1};
  RelayLoop loop{f.store,           {&old_sink}, router, f.clock, f.metrics, outbox::testing::loop_options(2, 5, {}),
                 [] { return 0.0; }};
  Runner runner(loop, f.store, f.waiter, f.clock, f.metrics, f.health, f.options, [] { return 0.0; });
  // The catch-up's drain claims 1 and 2 (a full batch), then 3 (perhaps ahead, while 1 and 2 are in
  // flight, on the helper thread that posts); the first poll finds nothing, the second finds 4.
  f.store.batches = {{event(1), event(2)}, {event(3)}, {}, {event(4)}};
  RunnerOptions slower = f.options;
  slower.sweep_interval = milliseconds(20'000);
  old_sink.on_publish = [&] {
    runner.post({{&new_sink}, &router, outbox::testing::loop_options(7, 5, {}), slower});
    CHECK(runner.reconfiguration_pending());
  };
  runner.run();
  CHECK_FALSE(runner.reconfiguration_pending());
  // The batch in flight went to the old sink whole; the one claimed ahead beside it, if any, too.
  const bool ahead = old_sink.ids.size() == 3;
  CHECK(old_sink.ids == (ahead ? std::vector<EventId>{1, 2, 3} : std::vector<EventId>{1, 2}));
  CHECK(new_sink.ids == (ahead ? std::vector<EventId>{4} : std::vector<EventId>{3, 4}));
  CHECK(loop.options().batch_size == 7);
  // The sweep at 10 s (set before the reload, and no later than the new interval says), then 20 s
  // apart: none more before 25 s.
  CHECK(f.store.claims.back() == at(10'000));
  CHECK(std::count(f.store.claims.begin(), f.store.claims.end(), at(10'000)) == 1);
}

TEST_CASE("runner: a long drain takes a reconfiguration between two of its batches") {
  Fixture f;
  f.waiter.stop_at = at(1'000);
  RecordingSink old_sink("old"), new_sink("new");
  const Router router{{}, 1};
  RelayLoop loop{f.store,           {&old_sink}, router, f.clock, f.metrics, outbox::testing::loop_options(2, 5, {}),
                 [] { return 0.0; }};
  Runner runner(loop, f.store, f.waiter, f.clock, f.metrics, f.health, f.options, [] { return 0.0; });
  // A backlog of full batches: one drain, until the short claim at the end.
  f.store.batches = {{event(1), event(2)}, {event(3), event(4)}, {event(5), event(6)}, {event(7), event(8)}, {}};
  old_sink.on_publish = [&] {
    runner.post({{&new_sink}, &router, outbox::testing::loop_options(2, 5, {}), f.options});
  };
  runner.run();
  // 1-2 in flight when it was posted, 3-4 perhaps claimed ahead beside them; from then on the new sink.
  CHECK(old_sink.ids.size() + new_sink.ids.size() == 8);
  CHECK(std::vector<EventId>(old_sink.ids.begin(), old_sink.ids.begin() + 2) == std::vector<EventId>{1, 2});
  CHECK(old_sink.ids.size() <= 4);
  CHECK(std::vector<EventId>(new_sink.ids.end() - 4, new_sink.ids.end()) == std::vector<EventId>{5, 6, 7, 8});
  CHECK(f.store.claims.size() == 5);  // one drain's claims: no poll came between
  CHECK(ms_list(f.store.claims) == std::vector<long long>(5, 0));
}

namespace {

// A sink that keeps progress downstream (Kafka exactly once): records the runner's takeover
// calls and the outcomes the loop reports written; after publishing `fence_after` batches it
// wants a takeover again (as a fenced producer does).
class TakeoverSink final : public NamedSink {
 public:
  TakeoverSink(const FakeStore& store, FakeClock& clock) : NamedSink("eos"), store_(store), clock_(clock) {}
  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    CHECK_FALSE(wants);  // never asked to publish before its takeover
    for (const Event* e : events) ids.push_back(e->id);
    if (events.front()->id == fails_at) {  // fenced while it worked on this batch: hands it back
      fails_at = 0;
      wants = true;
      clock_.t += fail_takes;
      return std::vector<Outcome>(events.size(), Outcome::deferred("fenced"));
    }
    if (++batches == fence_after) wants = true;
    return std::vector<Outcome>(events.size(), Outcome::delivered());
  }
  bool wants_takeover() const override { return wants; }
  std::vector<EventId> take_over(int lanes_owned, bool gained) override {
    takeovers.push_back(
        {store_.rebalances.size(), lanes_owned, gained, clock_.t, store_.claims.size() + store_.probes.size()});
    if (failing_takeovers > 0) {
      --failing_takeovers;  // the broker cannot be reached: it still wants one
      return {};
    }
    wants = false;
    return {7, 8};
  }
  void store_identity(const std::string& identity) override { identities.push_back(identity); }
  void keep_pending(std::span<const EventId> pending) override { kept.assign(pending.begin(), pending.end()); }
  void outcomes_written(std::span<const Completion> completions) override {
    for (const auto& c : completions) written.push_back(c.id);
  }
  struct Call {
    std::size_t rebalances_before;
    int lanes_owned;
    bool gained;
    Time at;
    std::size_t claims_before;  // claims and polls so far
  };
  const FakeStore& store_;
  FakeClock& clock_;
  EventId fails_at = 0;  // a batch starting with this id fails (after fail_takes)
  milliseconds fail_takes{0};
  bool wants = true;
  int batches = 0;
  int fence_after = 0;
  int failing_takeovers = 0;
  std::vector<Call> takeovers;
  std::vector<EventId> ids, kept, written;
  std::vector<std::string> identities;
};

}  // namespace

TEST_CASE("runner: a sink that keeps progress downstream takes over right after each rebalance, before it publishes") {
  Fixture f;
  f.waiter.stop_at = at(12'000);
  TakeoverSink sink(f.store, f.clock);
  sink.fence_after = 1;  // the first batch leaves it wanting a takeover again
  const Router router{{}, 1};
  RelayLoop loop{f.store,           {&sink}, router, f.clock, f.metrics, outbox::testing::loop_options(10, 5, {}),
                 [] { return 0.0; }};
  f.store.batches = {{event(1), event(2)}, {}, {event(3)}};
  Runner runner(loop, f.store, f.waiter, f.clock, f.metrics, f.health, f.options, [] { return 0.0; });
  runner.run();
  REQUIRE(sink.takeovers.size() >= 3);
  // At the session's start: after its first rebalance, with every lane the store owns.
  CHECK(sink.takeovers[0].rebalances_before == 1);
  CHECK(sink.takeovers[0].lanes_owned == kLaneCount);
  // The store's answer for the ids the downstream held (a store that cannot look keeps them all).
  CHECK(sink.kept == std::vector<EventId>{7, 8});
  // After the first batch it wanted a takeover: the runner rebalanced first, then took over.
  CHECK(sink.takeovers[1].rebalances_before == 2);
  CHECK(sink.takeovers[1].at == at(0));
  // Every rebalance is followed by a takeover call (the sink decides whether it has work).
  CHECK(sink.takeovers.size() == f.store.rebalances.size());
  CHECK(sink.ids == std::vector<EventId>{1, 2, 3});
  // The loop told the sink each outcome it wrote.
  CHECK(sink.written == std::vector<EventId>{1, 2, 3});
}

TEST_CASE(
    "runner: while a sink's takeover fails, nothing is claimed (no event pays an attempt for it); then all flows") {
  Fixture f;
  f.waiter.stop_at = at(12'000);
  TakeoverSink sink(f.store, f.clock);
  sink.failing_takeovers = 3;
  const Router router{{}, 1};
  RelayLoop loop{f.store,           {&sink}, router, f.clock, f.metrics, outbox::testing::loop_options(10, 5, {}),
                 [] { return 0.0; }};
  f.store.batches = {{event(1), event(2)}, {}};
  Runner runner(loop, f.store, f.waiter, f.clock, f.metrics, f.health, f.options, [] { return 0.0; });
  runner.run();
  REQUIRE(sink.takeovers.size() >= 4);
  for (std::size_t i = 0; i < 4; ++i) CHECK(sink.takeovers[i].claims_before == 0);  // none before it succeeded
  CHECK(sink.ids == std::vector<EventId>{1, 2});
  CHECK(sink.written == std::vector<EventId>{1, 2});
  // The store's identity is handed over before every takeover.
  CHECK(sink.identities.size() == sink.takeovers.size());
}

TEST_CASE(
    "runner: after a takeover at the periodic rebalance, a drain from the start finds the batch the sink handed back") {
  Fixture f;
  f.waiter.stop_at = at(12'000);
  TakeoverSink sink(f.store, f.clock);
  // A poll at 4 s finds event 99; the sink fails on it and hands it back, by when the periodic
  // rebalance (every 5 s) is due: that rebalance's takeover must be followed by a full drain, as
  // the next poll would look above 99.
  f.store.event_at = at(4'000);
  sink.fails_at = 99;
  sink.fail_takes = milliseconds(1'500);
  const Router router{{}, 1};
  RelayLoop loop{f.store,           {&sink}, router, f.clock, f.metrics, outbox::testing::loop_options(10, 5, {}),
                 [] { return 0.0; }};
  Runner runner(loop, f.store, f.waiter, f.clock, f.metrics, f.health, f.options, [] { return 0.0; });
  runner.run();
  REQUIRE(sink.ids == std::vector<EventId>{99});
  const Time failed = sink.takeovers.at(1).at;
  CHECK(failed >= at(5'000));
  CHECK(sink.takeovers[1].rebalances_before == 2);  // the periodic one
  REQUIRE(!f.store.claims.empty());
  CHECK(f.store.claims.back() == failed);  // the drain from the start, before any poll
  // The poll that found 99 (the first at or after 4 s) was the last before the drain from the start.
  const auto found = std::find_if(f.store.probes.begin(), f.store.probes.end(), [](Time t) { return t >= at(4'000); });
  REQUIRE(found != f.store.probes.end());
  CHECK(std::none_of(found + 1, f.store.probes.end(), [&](Time t) { return t < failed; }));
}
