#pragma once
// Refusing transaction-pooling proxies (PgBouncer's pool_mode = transaction or statement, and the
// like). Such a proxy runs each transaction of a client on whichever server backend is free, so
// the relay's LISTEN, its session advisory locks (lanes, membership) and its prepared statements
// would land on backends shared with other clients: claims fail or, worse, two relays share one
// backend's lane locks and per-key order breaks. A session pooler (pool_mode = session) gives
// each client one backend for its whole connection and is fine. docs/operations.md "Connection
// poolers".
#include <string>
#include <vector>

#include "core/store.hpp"

namespace pqxx {
class connection_base;
}

namespace outbox::pg {

// pg_backend_pid() as the probe reads it, in rounds: our session (autocommit), then a second
// session of ours inside an open transaction (so that it holds its backend), then our session
// again while the second one still holds its backend (skipped when the second got ours).
struct BackendPids {
  std::vector<int> session;               // every reading of our session, in order
  std::vector<int> other_in_transaction;  // the second session's reading of each round
};

// True when the readings prove that our session does not own its backend: it moved to another
// one, or the other session got it. A direct or session-pooled connection never does either.
// (A transaction pooler can escape the probe only if other clients' traffic hands our two
// sessions backends in just the right order in every round; the probe runs at every session
// open.)
bool shares_backend(const BackendPids& pids);

// database.url leads to a transaction pooler. A StoreUnavailable, so that the runner keeps
// retrying after a reconnect (the operator may fix the proxy); at start it exits 2.
class TransactionPoolerDetected : public StoreUnavailable {
 public:
  TransactionPoolerDetected();
};

// Runs the probe on `session` (a fresh session of ours, no transaction open) with a second,
// short-lived session opened on `url`; throws TransactionPoolerDetected when the backend is
// shared, or when the second session is closed as it opens a transaction while ours still
// answers (a statement pooler). Three rounds; probes of one process run one at a time (two at
// once would hand each other backends and hide a pooler). Takes no locks, prepares nothing.
// Throws StoreUnavailable when the database fails; a second session that cannot be opened at
// all (e.g. max_connections reached) is logged and the check skipped. Blocks for one connect
// and about a dozen round trips.
void ensure_own_backend(pqxx::connection_base& session, const std::string& url);

}  // namespace outbox::pg
