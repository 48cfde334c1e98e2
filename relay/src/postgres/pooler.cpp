#include "postgres/pooler.hpp"

#include <mutex>

#include "log/log.hpp"
#include "postgres/session.hpp"

namespace outbox::pg {
namespace {

int backend_pid(pqxx::connection_base& c) {
  pqxx::nontransaction q(c);
  return q.exec1("SELECT pg_backend_pid()")[0].as<int>();
}

}  // namespace

bool shares_backend(const BackendPids& pids) {
  for (int pid : pids.session) {
    if (pid != pids.session.front()) return true;  // our session moved to another backend
  }
  for (int pid : pids.other_in_transaction) {
    for (int ours : pids.session) {
      if (pid == ours) return true;  // another session got our backend
    }
  }
  return false;
}

TransactionPoolerDetected::TransactionPoolerDetected()
    : StoreUnavailable(
          "database.url leads to a transaction-pooling proxy (such as PgBouncer with pool_mode = transaction or "
          "statement): a session of the relay does not keep a server backend of its own. The relay needs one "
          "for LISTEN and its advisory locks: connect it to PostgreSQL directly or through a session pool "
          "(pool_mode = session); writers may keep using the transaction pool") {}

void ensure_own_backend(pqxx::connection_base& session, const std::string& url) {
  static std::mutex one_probe_at_a_time;
  const std::lock_guard<std::mutex> lock(one_probe_at_a_time);
  translate_errors("transaction pooler check", [&] {
    BackendPids pids;
    pids.session.push_back(backend_pid(session));
    std::unique_ptr<pqxx::connection> other;
    try {
      other = open_session(url, "pooler-check");
    } catch (const std::exception& e) {
      log::warn("could not open a second session to check database.url for a transaction pooler; check skipped",
                {{"error", describe_error(e)}});
      return;
    }
    constexpr int kRounds = 3;
    for (int round = 0; round < kRounds && !shares_backend(pids); ++round) {
      if (round > 0) pids.session.push_back(backend_pid(session));
      try {
        // The open transaction pins the other session's backend: a transaction pooler that has
        // just taken our backend back (our statement ended) hands it to this session; and while
        // this session holds a backend, our next statement cannot run on it.
        pqxx::work tx(*other);
        pids.other_in_transaction.push_back(tx.exec1("SELECT pg_backend_pid()")[0].as<int>());
        // Only when they differ: with one shared backend, our statement would wait for this
        // transaction, which waits for us.
        if (!shares_backend(pids)) pids.session.push_back(backend_pid(session));
        tx.abort();
      } catch (const pqxx::broken_connection&) {
        // A statement pooler closes a client that opens a transaction. If our session still
        // answers, that is what happened, not a network failure.
        backend_pid(session);
        throw TransactionPoolerDetected();
      }
    }
    if (shares_backend(pids)) {
      log::debug("backend pids of the pooler check",
                 {{"session", pids.session}, {"other_in_transaction", pids.other_in_transaction}});
      throw TransactionPoolerDetected();
    }
  });
}

}  // namespace outbox::pg
