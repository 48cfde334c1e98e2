// The LISTEN session's watch decision (postgres/idle_watch.hpp) driven directly: when it looks at
// the table, when it watches the id sequence, when it only waits for a NOTIFY.
#include <doctest/doctest.h>

#include <chrono>

#include "postgres/idle_watch.hpp"

using namespace outbox::pg;
using namespace std::chrono_literals;

namespace {

const IdleWatch::Time kT0{};

}  // namespace

TEST_CASE("idle watch: off, the session only listens and never looks") {
  IdleWatch w(false);
  CHECK_FALSE(w.look_due(kT0));
  CHECK_FALSE(w.look_due(kT0 + 1h));
  CHECK_FALSE(w.watching());
  CHECK_FALSE(w.watch_above(41));  // an offer is not taken: wait for a NOTIFY
}

TEST_CASE("idle watch: looks at the start, then every minute") {
  IdleWatch w(true);
  CHECK(w.look_due(kT0));
  CHECK_FALSE(w.looked(kT0, "public.outbox_events_id_seq"));
  CHECK(w.watching());
  CHECK(w.sequence() == "public.outbox_events_id_seq");
  CHECK_FALSE(w.look_due(kT0 + 59'999ms));
  CHECK(w.look_due(kT0 + IdleWatch::kLookAgain));
}

TEST_CASE("idle watch: watches above the loop's offer, or waits for a NOTIFY without one") {
  IdleWatch w(true);
  w.looked(kT0, "s");
  CHECK(w.watch_above(41) == 41);
  CHECK_FALSE(w.watch_above(std::nullopt));  // no offer: the loop is busy, wait for the bell
  CHECK(IdleWatch::new_id(42, 41));          // an id above the offer was drawn: ring kWatch
  CHECK_FALSE(IdleWatch::new_id(41, 41));    // the statement ran out: watch again
  CHECK_FALSE(IdleWatch::new_id(0, 41));     // nothing drawn (or the sequence restarted)
}

TEST_CASE("idle watch: no sequence to watch is said once, and again after a change") {
  IdleWatch w(true);
  CHECK(w.looked(kT0, std::nullopt));  // first look: say why
  CHECK_FALSE(w.watching());
  CHECK_FALSE(w.watch_above(41));
  CHECK_FALSE(w.looked(kT0 + 60s, std::nullopt));  // unchanged: quiet
  CHECK_FALSE(w.looked(kT0 + 120s, "s"));          // a watch now
  CHECK(w.watching());
  CHECK(w.looked(kT0 + 180s, std::nullopt));  // lost it (a push trigger, a grant revoked): say why again
}

TEST_CASE("idle watch: a failed watch listens only until the next look") {
  IdleWatch w(true);
  w.looked(kT0, "s");
  w.watch_failed();
  CHECK_FALSE(w.watching());
  CHECK_FALSE(w.watch_above(41));
  CHECK_FALSE(w.look_due(kT0 + 30s));
  CHECK(w.look_due(kT0 + 60s));
  CHECK_FALSE(w.looked(kT0 + 60s, std::nullopt));  // still none: not said again (the failure was, at warn)
}

TEST_CASE("idle watch: a statement reads the sequence length/check times, at least twice") {
  const auto d = watch_statement(100ms, 1000ms);
  CHECK(d.checks == 10);
  CHECK(d.check_seconds == doctest::Approx(0.1));
  CHECK(watch_statement(500ms, 100ms).checks == 2);    // at least one sleep per statement
  CHECK(watch_statement(0ms, 1000ms).checks == 1000);  // a check of 0 counts as 1 ms
  CHECK(watch_statement(0ms, 1000ms).check_seconds == 0);
}
