#include <doctest/doctest.h>

#include "postgres/pg_store.hpp"

using outbox::pg::rfc3339_utc;

TEST_CASE("created_at is formatted from microseconds as Postgres' to_char did") {
  CHECK(rfc3339_utc(0) == "1970-01-01T00:00:00.000000Z");
  CHECK(rfc3339_utc(1'764'484'342'123'456) == "2025-11-30T06:32:22.123456Z");
  CHECK(rfc3339_utc(951'782'400'000'001) == "2000-02-29T00:00:00.000001Z");  // a leap day
  CHECK(rfc3339_utc(-1) == "1969-12-31T23:59:59.999999Z");
}

TEST_CASE("lane membership: lanes one by one, or whole groups, and incomplete groups given back") {
  using outbox::pg::incomplete_group_lanes;
  using outbox::pg::lane_targets;
  // Ungrouped: lane mod instances.
  CHECK(lane_targets(1, 3, 0).size() == 21);
  CHECK(lane_targets(1, 3, 0).count(4) == 1);
  // One group (Kafka exactly once): the first instance aims for all 64 lanes, the others none.
  CHECK(lane_targets(0, 3, 1).size() == 64);
  CHECK(lane_targets(1, 3, 1).empty());
  CHECK(lane_targets(2, 3, 1).empty());
  // Eight groups over three instances: groups 0,3,6 / 1,4,7 / 2,5, whole.
  CHECK(lane_targets(0, 3, 8).size() == 24);
  CHECK(lane_targets(2, 3, 8).size() == 16);
  for (int lane : lane_targets(1, 3, 8)) CHECK((lane % 8) % 3 == 1);
  // Gained lanes of a group still partly held elsewhere go back; a completed group stays.
  std::vector<int> all;
  for (int lane = 0; lane < 64; ++lane) all.push_back(lane);
  CHECK(incomplete_group_lanes({}, all, 1).empty());
  CHECK(incomplete_group_lanes({}, {0, 1, 2}, 1) == std::vector<int>{0, 1, 2});
  std::vector<int> group3;
  for (int lane = 3; lane < 64; lane += 8) group3.push_back(lane);
  CHECK(incomplete_group_lanes({}, group3, 8).empty());
  CHECK(incomplete_group_lanes({3}, {11, 19, 27, 35, 43, 51, 59}, 8).empty());
  CHECK(incomplete_group_lanes({}, {11, 19, 4}, 8) == std::vector<int>{11, 19, 4});
  CHECK(incomplete_group_lanes({}, {5}, 0).empty());  // ungrouped: nothing to give back
}
