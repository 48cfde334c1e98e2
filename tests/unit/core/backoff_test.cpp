#include <doctest/doctest.h>

#include "core/backoff.hpp"

using outbox::backoff_delay;
using outbox::BackoffPolicy;
using std::chrono::milliseconds;

TEST_CASE("backoff doubles per attempt with equal jitter") {
  const BackoffPolicy p{milliseconds(1000), milliseconds(300'000)};
  CHECK(backoff_delay(p, 1, 0.0) == milliseconds(500));
  CHECK(backoff_delay(p, 1, 0.999999) == milliseconds(999));
  CHECK(backoff_delay(p, 2, 0.0) == milliseconds(1000));
  CHECK(backoff_delay(p, 3, 0.5) == milliseconds(3000));
  CHECK(backoff_delay(p, 4, 1.0) == milliseconds(8000));
}

TEST_CASE("backoff is capped at max, even for huge attempt counts") {
  const BackoffPolicy p{milliseconds(1000), milliseconds(300'000)};
  CHECK(backoff_delay(p, 20, 1.0) == milliseconds(300'000));
  CHECK(backoff_delay(p, 20, 0.0) == milliseconds(150'000));
  CHECK(backoff_delay(p, 1'000'000, 1.0) == milliseconds(300'000));
  CHECK(backoff_delay(p, 0, 0.0) == milliseconds(500));  // defensive: attempts < 1
}

TEST_CASE("Retry-After raises the delay but never past max") {
  const BackoffPolicy p{milliseconds(100), milliseconds(5000)};
  CHECK(backoff_delay(p, 1, 0.0, milliseconds(2000)) == milliseconds(2000));
  CHECK(backoff_delay(p, 1, 0.0, milliseconds(60'000)) == milliseconds(5000));
  CHECK(backoff_delay(p, 1, 0.0, milliseconds(10)) == milliseconds(50));  // backoff wins when longer
}
