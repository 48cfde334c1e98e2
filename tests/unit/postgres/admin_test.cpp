// How operator commands report the ids they changed.
#include <doctest/doctest.h>

#include "postgres/admin.hpp"

using outbox::pg::IdRanges;

TEST_CASE("ids fold into ranges") {
  IdRanges r;
  CHECK(r.describe() == "none");
  for (long long id : {3, 4, 5, 6, 7, 9, 12, 13}) r.add(id);
  CHECK(r.count() == 8);
  CHECK(r.ranges().size() == 3);
  CHECK(r.describe() == "3-7, 9, 12-13");
  CHECK(r.describe(2) == "3-7, 9, ... (1 more ranges)");
}

TEST_CASE("a million consecutive ids stay one range") {
  IdRanges r;
  for (long long id = 1; id <= 1'000'000; ++id) r.add(id);
  CHECK(r.count() == 1'000'000);
  CHECK(r.describe() == "1-1000000");
}
