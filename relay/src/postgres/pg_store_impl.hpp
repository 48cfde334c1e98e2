#pragma once
// PgStore's inside, shared by the files that implement it (this folder only, libpqxx included):
// pg_store.cpp (the sessions, complete, leases), claim_protocol.cpp (the schema check, the lean
// poll and the claim function), lane_membership.cpp (membership locks and rebalance),
// writer_report.cpp (the writers' reading, the sequence's cache, what holds events back).
#include <atomic>
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "postgres/claim_state.hpp"
#include "postgres/lane_bounds.hpp"
#include "postgres/pg_store.hpp"
#include "postgres/pooler.hpp"
#include "postgres/session.hpp"

namespace outbox::pg {

// Outcomes as the complete statement and the claim function take them: the delivered ids as an
// array literal, the others as a JSON array of {id, kind, delay_ms, error, sinks_done}.
struct EncodedCompletions {
  std::string delivered;
  std::string others;
  // The latest created_at of these events ("infinity" if one is unknown): no outcome touches a
  // row created after it (a new row under a reused id, schema/010).
  std::string created_upto;
};

EncodedCompletions encode_completions(std::span<const Completion> completions);
const char* completion_kind(Completion::Kind kind);

// Every row the relay writes (leases, outcomes, cleared leases) is written again if a crash of
// Postgres loses it: a lost lease makes a row claimable again, a lost mark delivers it again (at
// least once, as always; docs/design.md, "Failure model"). So no statement of the relay waits for
// the WAL flush (nor, with synchronous replication, for a standby): a flush stalled behind other I/O
// would stall deliveries, and with them every event behind. A condition to AND into an autocommit
// statement's WHERE: set_config(..., true) lasts until the statement's implicit transaction
// commits; an InitPlan runs it once.
constexpr const char* kNoFlushWait = " AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off' ";

std::string lane_literal(const LaneIds& ids);

struct PgStore::Impl {
  PgStoreOptions opt;
  HintContext hints;                            // names for the operator's hint
  std::unique_ptr<pqxx::connection> conn;       // claims, lanes, membership: the loop thread
  std::unique_ptr<pqxx::connection> done_conn;  // complete(): may run beside a claim
  // The worker session failed on a statement but is still open: nothing runs on it any more, and
  // it keeps its lanes until close_failed_session() or connect() drops it, so that the runner can
  // write the outcomes the loop holds first (Store::failed_session_open).
  std::atomic<bool> failed{false};
  int member_ns = 0;
  int lane_ns = 0;
  int groups_ns = 0;        // each member also holds (groups_ns, its lane groups) shared: peers see the mix
  std::string groups_seen;  // the lane groups of the members at the last rebalance, as logged
  int member_id = 0;
  std::set<int> owned;
  std::atomic<int> owned_count{0};
  std::string owned_literal = "{}";
  // Claims stop adding rows once their bytes reach this (schema 12); 0: no bound. Set from the loop
  // thread (Store::limit_claim_bytes), read by claims.
  std::atomic<std::size_t> claim_bytes{0};
  std::mt19937 rng{std::random_device{}()};

  TableNames names;          // resolved at the first connect (table_names)
  std::string complete_sql;  // built at the first connect, with names.table
  std::string sequence;      // the id sequence, schema-qualified
  // With lane groups (Kafka exactly once): which table of which cluster this is (Store::identity).
  std::string identity;
  // The lane bounds, the writers' reading, quiet and fenced.
  ClaimState state;
  // What the operator sees of the writers holding events back (Store::writer_holds).
  WriterHolds holds;
  std::chrono::steady_clock::time_point counted_at{};
  struct Warned {
    std::chrono::steady_clock::time_point first_seen;
    std::optional<std::chrono::steady_clock::time_point> warned_at;
  };
  std::map<std::string, Warned> warned;  // by vxid, the writers holding events back now

  // Reads the writers first when due (LaneBounds::reading_due), then claims: the lean poll while
  // every lane is alike, else the claim function lane by lane.
  std::vector<Event> claim_lanes(std::size_t limit, bool probe, std::span<const Completion> completions,
                                 long long floor);
  void read_writers(pqxx::nontransaction& tx, std::chrono::steady_clock::time_point now);
  // After a statement that wrote several events' outcomes failed with an error one row can cause
  // (row_tied_sqlstate): writes them one event at a time on tx's session, and dead-letters, with
  // the reason, an event whose own outcome cannot be written, so that one row never stalls the
  // others (issue 42: a retry an operator's constraint refuses; before schema 13 also the retry of
  // a key too long for a B-tree entry).
  void write_outcomes_one_by_one(pqxx::nontransaction& tx, std::span<const Completion> completions);
  // A reading's (or a connect's) look at the id sequence's CACHE: health, metric and error log.
  void sequence_cache_seen(long long cache, std::chrono::steady_clock::time_point now);
  // A rebalance's look at the lane groups its peers hold (health, and an error log when they
  // start to disagree).
  void lane_groups_seen(const std::set<long long>& held);
  // At connect and at each rebalance, so that a change is said (and cleared) while the relay is
  // idle too, not only when a reading finds a gap (schema/010).
  void look_at_sequence_cache(pqxx::transaction_base& tx) {
    const auto cache = tx.exec_params1(
        "SELECT s.seqcache FROM pg_catalog.pg_sequence AS s WHERE s.seqrelid = $1::pg_catalog.regclass", sequence);
    if (!cache[0].is_null()) sequence_cache_seen(cache[0].as<long long>(), std::chrono::steady_clock::now());
  }
  long long cache_seen = 0;
  std::chrono::steady_clock::time_point cache_warned_at{};
  // After a reading: the held events (counted at most once a second), the metrics' figures and the
  // warnings for writers that held events back for longer than writer_hold_warning.
  void report_holds(pqxx::nontransaction& tx, std::chrono::steady_clock::time_point now);
  // Refuses a table whose schema is older than this relay's (SchemaTooOld), then prepares the
  // session's statements on c.
  void prepare_statements(pqxx::connection& c);

  void set_owned(std::set<int> lanes_now) {
    owned = std::move(lanes_now);
    LaneMask mask = 0;
    for (int lane : owned) mask |= lane_bit(lane);
    state.set_owned(mask);
    owned_count = static_cast<int>(owned.size());
    std::vector<int> v(owned.begin(), owned.end());
    owned_literal = int_array(v.data(), v.data() + v.size());
  }

  void drop() {
    conn.reset();
    failed = false;
    set_owned({});
    state.session_lost();
    holds = {};
    warned.clear();
  }

  // Runs fn on the worker session with its errors translated (session.hpp); a lost session is
  // dropped, with the lanes it held, and made again by the next call.
  template <class Fn>
  auto on_worker(const char* what, Fn&& fn) -> decltype(fn()) {
    try {
      return translate_errors(what, std::forward<Fn>(fn), hints);
    } catch (const StoreUnavailable&) {
      if (conn && conn->is_open()) {
        failed = true;  // a statement failed: the lanes stay held until close_failed_session()
      } else {
        drop();
      }
      throw;
    }
  }

  // Refuses a session on a transaction pooler (postgres/pooler.hpp), reporting the result to the
  // readiness check; logs an error when one appears.
  void check_own_backend(pqxx::connection& c) {
    try {
      ensure_own_backend(c, opt.url);
    } catch (const TransactionPoolerDetected& e) {
      if (opt.health && !opt.health->transaction_pooler.exchange(true)) {
        log::error(
            "refusing to work through a transaction pooler; not claiming until database.url leads to a "
            "session of our own",
            {{"error", e.what()}});
      }
      throw;
    }
    if (opt.health) opt.health->transaction_pooler = false;
  }
};

}  // namespace outbox::pg
