// The sinks' one batch summary for the log: the counts and the first failure.
#include "sinks/common/batch_log.hpp"

#include <doctest/doctest.h>

#include <vector>

using namespace outbox;
using namespace outbox::sinks;

TEST_CASE("batch summary: counts each outcome, and the first retry or dead letter is the first failure") {
  const std::vector<Outcome> outcomes{Outcome::delivered(), Outcome::deferred(), Outcome::permanent("too large"),
                                      Outcome::retry("broker down"), Outcome::delivered()};
  const BatchSummary s = BatchSummary::of(outcomes);
  CHECK(s.delivered == 2);
  CHECK(s.retry == 1);
  CHECK(s.permanent == 1);
  CHECK(s.deferred == 1);
  REQUIRE(s.first_failure != nullptr);
  CHECK(s.first_failure == &outcomes[2]);
  CHECK(s.first_failure->reason == "too large");
}

TEST_CASE("batch summary: deferred events alone are no failure, and nothing is logged") {
  const std::vector<Outcome> outcomes{Outcome::delivered(), Outcome::deferred()};
  const BatchSummary s = BatchSummary::of(outcomes);
  CHECK(s.first_failure == nullptr);
  CHECK_FALSE(log_batch("test", "sink", outcomes));
  CHECK_FALSE(log_batch("test", "sink", {}));
  const std::vector<Outcome> failed{Outcome::delivered(), Outcome::retry("timeout")};
  CHECK(log_batch("test", "sink", failed, {{"rounds", 2}}));
}
