#include <doctest/doctest.h>

#include "postgres/pg_store.hpp"

using outbox::pg::rfc3339_utc;

TEST_CASE("created_at is formatted from microseconds as Postgres' to_char did") {
  CHECK(rfc3339_utc(0) == "1970-01-01T00:00:00.000000Z");
  CHECK(rfc3339_utc(1'764'484'342'123'456) == "2025-11-30T06:32:22.123456Z");
  CHECK(rfc3339_utc(951'782'400'000'001) == "2000-02-29T00:00:00.000001Z");  // a leap day
  CHECK(rfc3339_utc(-1) == "1969-12-31T23:59:59.999999Z");
}
