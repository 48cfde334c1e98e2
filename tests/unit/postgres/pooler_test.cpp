// The transaction pooler decision (postgres/pooler.hpp) on the backend pids a probe reads.
#include <doctest/doctest.h>

#include "postgres/pooler.hpp"

using outbox::pg::BackendPids;
using outbox::pg::shares_backend;

TEST_CASE("a session of our own: the other session gets other backends, ours stays") {
  // Direct, or PgBouncer in session mode: three rounds, our backend fixed, the second session's
  // backend anything else (a session pool may give it a different one each round).
  CHECK_FALSE(shares_backend(BackendPids{{101, 101, 101, 101, 101, 101}, {102, 103, 102}}));
  CHECK_FALSE(shares_backend(BackendPids{{101}, {}}));  // nothing to compare yet
  // (A transaction pooler whose other clients' traffic produced exactly these readings would
  // escape the probe; it runs again at every session open.)
}

TEST_CASE("a transaction pooler that hands our backend to the other session (LIFO reuse)") {
  // PgBouncer's default: the backend our statement just released goes to the next transaction.
  CHECK(shares_backend(BackendPids{{101}, {101}}));
  // ... also in a later round, or a backend we used earlier.
  CHECK(shares_backend(BackendPids{{101, 101, 101}, {102, 101}}));
}

TEST_CASE("a transaction pooler that moves our session to another backend") {
  CHECK(shares_backend(BackendPids{{101, 103}, {102}}));       // while the other holds 102 (round robin)
  CHECK(shares_backend(BackendPids{{101, 101, 102}, {102}}));  // in the next round
}

TEST_CASE("the pooler error names database.url and the way out") {
  const std::string message = outbox::pg::TransactionPoolerDetected().what();
  CHECK(message.starts_with("database.url leads to a transaction-pooling proxy"));
  CHECK(message.find("pool_mode = session") != std::string::npos);
  // A StoreUnavailable, so that the runner keeps retrying after a reconnect.
  CHECK_THROWS_AS(throw outbox::pg::TransactionPoolerDetected(), outbox::StoreUnavailable);
}
