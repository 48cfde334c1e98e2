#include "postgres/pg_store.hpp"

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <ctime>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "log/log.hpp"
#include "postgres/claim_state.hpp"
#include "postgres/lane_bounds.hpp"
#include "postgres/pooler.hpp"
#include "postgres/session.hpp"
#include "postgres/sqlstate.hpp"

namespace outbox::pg {

int advisory_key(const std::string& text) {
  std::uint32_t h = 2166136261u;
  for (unsigned char c : text) {
    h ^= c;
    h *= 16777619u;
  }
  return static_cast<int>(h & 0x7fffffff);
}

long long fence_tag(const std::string& table) { return advisory_key("outbox-relay:fence:" + table) & 0x3fffff; }

WriterMarkKeys writer_mark_keys(const std::string& table) {
  return {advisory_key("outbox-relay:writer-lanes:" + table), advisory_key("outbox-relay:writer-statements:" + table)};
}

// "2026-11-30T06:32:22.123456Z", as to_char(created_at AT TIME ZONE 'UTC', 'YYYY-MM-DD"T"HH24:MI:SS.US"Z"').
std::string rfc3339_utc(long long epoch_us) {
  long long secs = epoch_us / 1'000'000;
  long long us = epoch_us % 1'000'000;
  if (us < 0) {
    us += 1'000'000;
    --secs;
  }
  const std::time_t t = static_cast<std::time_t>(secs);
  std::tm tm{};
  gmtime_r(&t, &tm);
  char buf[96];
  std::snprintf(buf, sizeof buf, "%04d-%02d-%02dT%02d:%02d:%02d.%06lldZ", tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday,
                tm.tm_hour, tm.tm_min, tm.tm_sec, us);
  return buf;
}

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
  int member_id = 0;
  std::set<int> owned;
  std::atomic<int> owned_count{0};
  std::string owned_literal = "{}";
  std::mt19937 rng{std::random_device{}()};

  std::string complete_sql;
  std::string sequence;  // the id sequence, schema-qualified
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
  // others (a retry of a key too long for the retry index's entries, issue 42).
  void write_outcomes_one_by_one(pqxx::nontransaction& tx, std::span<const Completion> completions);
  // A reading's (or a connect's) look at the id sequence's CACHE: health, metric and error log.
  void sequence_cache_seen(long long cache, std::chrono::steady_clock::time_point now);
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

namespace {

// The rows of table alias c that a claim may take: not delivered nor dead-lettered, due, the lease
// clear or expired and not this instance's (owner), in its lanes: the lean poll and the sweep's
// look (the claim function states the same in SQL).
std::string claimable_rows(const std::string& owner, const std::string& lanes) {
  return "c.processed_at IS NULL AND c.dead_lettered_at IS NULL AND c.next_attempt_at <= now() "
         "AND (c.lease_until IS NULL OR (c.lease_until < now() AND c.lease_owner IS DISTINCT FROM " +
         owner +
         ")) "
         "AND c.lane = ANY(" +
         lanes + "::smallint[]) ";
}

// Schema 5's poll while every lane is alike (no writer holds one back) and no outcome rides along:
// the path of {prefix}_claim for p_probe with p_known and p_covered NULL and nothing done or
// failed, in one statement instead of a PL/pgSQL call of three (bench/RESULTS.md, "One statement
// for a poll": the call cost ~190-220 us around its ~120 us of SQL at 1,000 events/s). $1 the
// owner, $2 the lanes, $3 the limit, $4 resolved (>= 0: every id up to it is committed or gone).
// The same rows, in the same order, under the same row locks, and the same summary row:
//  - the walk from $4 to the highest id before the first one that is not visible, capped at the
//    last id drawn (the statement's snapshot is taken before that read, so the cap is only ever
//    higher; every id up to the bound is visible in the snapshot that the scan uses);
//  - the scan above $4 and up to that bound, with schema 7's head-of-line rule for a poll: while
//    any event has failed and is still pending, an event waits for every earlier failed and
//    pending one of its key, due or not;
//  - no lease (a poll writes none), no WAL flush wait.
// Its plan is generic and made once per session, possibly while the table has no statistics (new
// or truncated): so nothing in it may depend on them. The walk's NOT EXISTS carries OFFSET 0, which
// keeps it a probe of the primary key per id: planned as an anti join on an empty table, the probe
// became a scan of the whole index per id walked, and a relay started on a truncated table beside
// 16,600 events/s fell ~2 s behind until the first autoanalyze (bench/RESULTS.md, "A relay started
// on an empty table"). (The head-of-line look, run only while a retry waits, can still be planned
// as a sort on such a table. enable_sort = off for the whole worker session would keep it on the
// retry index, but it put the same soak's commit-to-sink p99 at 98-204 ms a window against 10-17
// ms without it, so it is not set.)
std::string lane_poll_sql(const std::string& table, const std::string& sequence_literal) {
  // Schema 10's skipped rows, as {prefix}_claim: the rows chosen, then locked (SKIP LOCKED); a row
  // another transaction holds (FOR SHARE, FOR UPDATE, an operator's UPDATE) stops its lane there
  // (nothing of the lane above it, the lane's bound below it), and the next claim looks from it
  // again. FOR NO KEY UPDATE: a foreign key's check (FOR KEY SHARE) holds nothing.
  std::string sql = R"sql(
WITH v AS MATERIALIZED (
  SELECT coalesce(pg_catalog.pg_sequence_last_value({sequence}::pg_catalog.regclass), 0) AS last,
         pg_catalog.set_config('synchronous_commit', 'off', true) AS async),
w AS MATERIALIZED (
  SELECT v.last,
         CASE WHEN $4::int8 >= v.last THEN $4::int8
              WHEN NOT EXISTS (SELECT 1 FROM {table} AS f WHERE f.id = $4::int8 + 1) THEN $4::int8
              ELSE coalesce((SELECT g.id FROM {table} AS g
                              WHERE g.id > $4::int8 AND g.id < v.last
                                AND NOT EXISTS (SELECT 1 FROM {table} AS h WHERE h.id = g.id + 1 OFFSET 0)
                              ORDER BY g.id LIMIT 1), v.last) END AS bound
    FROM v),
chosen AS MATERIALIZED (
  SELECT c.id, c.lane::smallint AS lane
    FROM {table} AS c
   WHERE {claimable}
     AND c.id > $4::int8 AND c.id <= (SELECT w.bound FROM w)
     AND (NOT EXISTS (SELECT 1 FROM {table} AS r
                       WHERE r.processed_at IS NULL AND r.dead_lettered_at IS NULL AND r.attempts > 0)
          OR (SELECT b.id FROM {table} AS b
               WHERE (b.aggregate_id, b.id) >= (c.aggregate_id, 0) AND (b.aggregate_id, b.id) < (c.aggregate_id, c.id)
                 AND b.processed_at IS NULL AND b.dead_lettered_at IS NULL AND b.attempts > 0
               ORDER BY b.aggregate_id, b.id LIMIT 1) IS NULL)
   ORDER BY c.id LIMIT $3),
locked AS MATERIALIZED (
  SELECT c.id, c.lane::smallint AS lane, c.topic, c.aggregate_id, c.payload, c.headers, c.created_at, c.attempts,
         c.sinks_done
    FROM {table} AS c
   WHERE c.id = ANY(ARRAY(SELECT ch.id FROM chosen AS ch))
     AND c.processed_at IS NULL AND c.dead_lettered_at IS NULL
     AND (c.lease_until IS NULL OR (c.lease_until < now() AND c.lease_owner IS DISTINCT FROM $1))
     FOR NO KEY UPDATE OF c SKIP LOCKED),
stop AS (
  SELECT ch.lane, min(ch.id) AS first
    FROM chosen AS ch WHERE NOT EXISTS (SELECT 1 FROM locked AS k WHERE k.id = ch.id) GROUP BY ch.lane)
SELECT k.id, k.topic, k.aggregate_id, k.payload::text, k.headers::text, NULL::text,
       (extract(epoch FROM k.created_at) * 1000000)::int8, k.attempts, k.sinks_done,
       NULL::int8, NULL::int8, NULL::int8[]
  FROM locked AS k
 WHERE NOT EXISTS (SELECT 1 FROM stop AS x WHERE x.lane = k.lane AND x.first < k.id)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, w.bound, w.last,
       CASE WHEN NOT EXISTS (SELECT 1 FROM stop) THEN ARRAY[w.bound]
            ELSE (SELECT array_agg(least(w.bound,
                                         coalesce((SELECT x.first - 1 FROM stop AS x WHERE x.lane = g.n), w.bound),
                                         CASE WHEN (SELECT count(*) FROM chosen) >= $3
                                              THEN (SELECT max(ch.id) FROM chosen AS ch) ELSE w.bound END)
                                   ORDER BY g.n)
                    FROM generate_series(0, 63) AS g(n)) END
  FROM w)sql";
  replace_all(sql, "{claimable}", claimable_rows("$1", "$2"));
  replace_all(sql, "{table}", table);
  replace_all(sql, "{sequence}", sequence_literal);
  return sql;
}

// Reads the columns shared by both claim forms: id, topic, key, payload, headers, created_at,
// created_at_us, attempts, sinks_done.
Event event_from_row(const pqxx::row& row) {
  Event e;
  e.id = row[0].as<long long>();
  e.topic.assign(row[1].c_str(), row[1].size());
  e.key.assign(row[2].c_str(), row[2].size());
  e.payload.assign(row[3].c_str(), row[3].size());
  e.headers_json.assign(row[4].c_str(), row[4].size());
  e.created_at_us = row[6].as<long long>();
  if (row[5].is_null()) {
    e.created_at = rfc3339_utc(e.created_at_us);  // schema 2: formatted here, not per row in Postgres
  } else {
    e.created_at.assign(row[5].c_str(), row[5].size());
  }
  e.attempts = row[7].as<int>();
  if (row[8].size() > 2) {  // not "{}"
    auto parser = row[8].as_array();
    for (auto item = parser.get_next(); item.first != pqxx::array_parser::done; item = parser.get_next()) {
      if (item.first == pqxx::array_parser::string_value) e.sinks_done.push_back(item.second);
    }
  }
  return e;
}

// Outcomes as the complete statement and the claim function take them: the delivered ids as an
// array literal, the others as a JSON array of {id, kind, delay_ms, error, sinks_done}.
struct EncodedCompletions {
  std::string delivered;
  std::string others;
  // The latest created_at of these events ("infinity" if one is unknown): no outcome touches a
  // row created after it (a new row under a reused id, schema/010).
  std::string created_upto;
};

const char* completion_kind(Completion::Kind kind) {
  switch (kind) {
    case Completion::Kind::kDelivered: return "delivered";
    case Completion::Kind::kRetry: return "retry";
    case Completion::Kind::kDeadLetter: return "dead";
    case Completion::Kind::kRelease: return "release";
  }
  return "release";  // not reached: the switch names every kind
}

EncodedCompletions encode_completions(std::span<const Completion> completions) {
  std::vector<long long> delivered;
  nlohmann::json others = nlohmann::json::array();
  long long upto_us = 0;
  bool unknown = false;
  for (const auto& c : completions) {
    upto_us = std::max(upto_us, c.created_at_us);
    unknown = unknown || c.created_at_us == 0;
    if (c.kind == Completion::Kind::kDelivered) {
      delivered.push_back(c.id);
      continue;
    }
    nlohmann::json item{
        {"id", c.id}, {"kind", completion_kind(c.kind)}, {"delay_ms", c.delay.count()}, {"sinks_done", c.sinks_done}};
    if (!c.error.empty()) item["error"] = c.error.substr(0, 2000);
    others.push_back(std::move(item));
  }
  return {int_array(delivered.data(), delivered.data() + delivered.size()),
          others.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
          unknown ? std::string("infinity") : rfc3339_utc(upto_us)};
}

// The claim function's answer: the claimed rows (in id order), then one row whose id is NULL, the
// bounds, given to on_summary with the events before it.
template <class OnSummary>
std::vector<Event> split_claim_rows(const pqxx::result& rows, OnSummary&& on_summary) {
  std::vector<Event> events;
  events.reserve(rows.size());
  for (const auto& row : rows) {
    if (row[0].is_null()) {
      on_summary(row, events);
    } else {
      events.push_back(event_from_row(row));
    }
  }
  return events;
}

std::string claim_function_name(const std::string& table) { return function_prefix(table) + "_claim"; }

// Every row the relay writes (leases, outcomes, cleared leases) is written again if a crash of
// Postgres loses it: a lost lease makes a row claimable again, a lost mark delivers it again (at
// least once, as always; docs/design.md, "Failure model"). So no statement of the relay waits for
// the WAL flush (nor, with synchronous replication, for a standby): a flush stalled behind other I/O
// would stall deliveries, and with them every event behind. A condition to AND into an autocommit
// statement's WHERE: set_config(..., true) lasts until the statement's implicit transaction
// commits; an InitPlan runs it once.
constexpr const char* kNoFlushWait = " AND (SELECT set_config('synchronous_commit', 'off', true)) = 'off' ";

// Schema 10's claim function, lane by lane (the only one this relay calls).
constexpr const char* kClaimFunctionArgs =
    "(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, bigint, bigint[], bigint[], "
    "timestamptz)";

std::string lane_literal(const LaneIds& ids) { return int_array(ids.data(), ids.data() + ids.size()); }

// A bigint[] in Postgres's text form ("{1,2,3}"), as 64 lanes; one element: every lane's.
LaneIds parse_lane_ids(const std::string& text) {
  LaneIds out{};
  out.fill(-1);
  if (text.find(',') == std::string::npos && text.size() > 2) {
    out.fill(std::stoll(text.substr(1, text.size() - 2)));
    return out;
  }
  std::size_t lane = 0;
  std::size_t pos = text.find_first_not_of('{');
  while (pos < text.size() && text[pos] != '}' && lane < out.size()) {
    const std::size_t end = text.find_first_of(",}", pos);
    out[lane++] = std::stoll(text.substr(pos, end - pos));
    if (end == std::string::npos || text[end] == '}') break;
    pos = end + 1;
  }
  return out;
}

// Warnings about a writer holding events back: this long after the previous one, at most.
constexpr auto kWriterWarningEvery = std::chrono::minutes(1);
// The held events are counted at most this often (a walk of the pending index over their range).
constexpr auto kHeldCountEvery = std::chrono::seconds(1);

}  // namespace

void PgStore::Impl::prepare_statements(pqxx::connection& c) {
  const std::string name = claim_function_name(opt.table);
  {
    pqxx::nontransaction q(c);
    // The schema this relay was built for; an older one is refused (`migrate` first: it runs
    // online, writers and older relays keep working through it).
    const auto r = q.exec_params1(
        "SELECT (SELECT max(m.version) FROM outbox_schema_migrations AS m WHERE m.table_name = $1), "
        "to_regprocedure($2) IS NOT NULL",
        opt.table, name + kClaimFunctionArgs);
    const int version = r[0].is_null() ? 0 : r[0].as<int>();
    if (version < kSchemaVersion || !r[1].as<bool>()) throw SchemaTooOld(opt.table, version);
  }
  c.prepare("claim_fn_lanes", "SELECT * FROM " + name +
                                  "($1, $2, $3::smallint[], $4, $5, $6, $7::bigint[], $8::jsonb, $9, $10, "
                                  "$11::bigint[], $12::bigint[], $13::timestamptz)");
  c.prepare("poll_lanes", lane_poll_sql(opt.table, c.quote(sequence)));
  c.prepare("writers", "SELECT * FROM " + function_prefix(opt.table) + "_writers()");
  // The committed events of held lanes above their bounds (the metrics' held events).
  c.prepare("held_count", "SELECT c.lane, count(*) FROM " + opt.table +
                              " AS c "
                              "WHERE c.processed_at IS NULL AND c.dead_lettered_at IS NULL "
                              "AND c.lane = ANY($1::smallint[]) AND c.id > $2 AND c.id <= $3 "
                              "AND c.id > ($4::bigint[])[c.lane + 1] GROUP BY c.lane");
  // With the last id drawn: one below $1 means the sequence was set back (LaneBounds), and the
  // claim must run to say so.
  c.prepare("anything_new", "SELECT (SELECT id FROM " + opt.table +
                                " WHERE id > $1 ORDER BY id LIMIT 1), "
                                "coalesce(pg_sequence_last_value(" +
                                c.quote(sequence) + "::regclass), 0)");
  // The sweep's look (first_claimable): the claim's predicate, without the head-of-line look.
  c.prepare("sweep_look", "SELECT c.id FROM " + opt.table + " AS c WHERE " + claimable_rows("$1", "$2") +
                              "AND c.id > $3 AND c.id <= $4 ORDER BY c.id LIMIT 1");
}

SchemaTooOld::SchemaTooOld(const std::string& table, int version)
    : StoreUnavailable("table " + table + " is at schema version " + std::to_string(version) +
                           (version == 0 ? " (not migrated)" : "") + "; this relay needs version " +
                           std::to_string(kSchemaVersion) +
                           ": run `outbox-relay migrate` with the same config first (it runs online; writers and "
                           "relays of the previous version keep working through it)",
                       DbErrorClass::kUndefinedObject,
                       // A hint of its own: translate_errors passes it on as it is (run.cpp tells it apart).
                       "run `outbox-relay migrate` with the same config") {}

PgStore::PgStore(PgStoreOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->hints = {url_user(impl_->opt.url), impl_->opt.table};
  const std::string& t = impl_->opt.table;
  impl_->member_ns = advisory_key("outbox-relay:members:" + t);
  impl_->lane_ns = advisory_key("outbox-relay:lanes:" + t);

  // Complete: one autocommit statement (one round trip, one commit) for a whole batch: $1 the
  // delivered ids, marked or deleted; $2 the other outcomes as a JSON array. Unreferenced
  // data-modifying CTEs still run. The commit does not wait for the WAL flush (kNoFlushWait): the
  // drain waits for this statement before it claims again, so a flush stalled by other I/O
  // (100-400 ms on a busy VM) held back every event behind it.
  const std::string done_sql =
      impl_->opt.delete_on_success
          ? "DELETE FROM " + t + " WHERE id = ANY($1::bigint[]) AND created_at <= $3::timestamptz"
          : "UPDATE " + t +
                " SET processed_at = now(), lease_owner = NULL, lease_until = NULL "
                "WHERE id = ANY($1::bigint[]) AND processed_at IS NULL "
                "AND created_at <= $3::timestamptz";
  impl_->complete_sql =
      "WITH done AS (" + done_sql +
      "), failed AS ("
      "UPDATE " +
      t +
      " AS e SET "
      "  attempts = e.attempts + CASE WHEN r.kind = 'release' THEN 0 ELSE 1 END, "
      "  next_attempt_at = CASE WHEN r.kind = 'retry' THEN now() + r.delay_ms * interval '1 millisecond' "
      "                         ELSE e.next_attempt_at END, "
      "  last_error = COALESCE(r.error, e.last_error), "
      "  dead_lettered_at = CASE WHEN r.kind = 'dead' THEN now() ELSE NULL END, "
      "  sinks_done = r.sinks_done, lease_owner = NULL, lease_until = NULL "
      "FROM jsonb_to_recordset($2::jsonb) AS r(id bigint, kind text, delay_ms bigint, error text, sinks_done text[]) "
      "WHERE e.id = r.id AND e.processed_at IS NULL AND e.created_at <= $3::timestamptz "
      "  AND e.id = ANY(ARRAY(SELECT (f->>'id')::bigint FROM jsonb_array_elements($2::jsonb) AS f))) "
      "SELECT set_config('synchronous_commit', 'off', true)";
}

PgStore::~PgStore() = default;

bool PgStore::waiting_for_writers() const { return impl_->state.fenced(); }

std::optional<long long> PgStore::watch_from() const { return impl_->state.watch_from(impl_->conn != nullptr); }

bool PgStore::reading_pending() const { return impl_->state.reading_pending(); }

WriterHolds PgStore::writer_holds() const { return impl_->holds; }

std::optional<long long> PgStore::sweep_upto() const { return impl_->state.sweep_upto(impl_->conn != nullptr); }

std::optional<long long> PgStore::first_claimable(long long after, long long upto) {
  connect();
  auto& im = *impl_;
  if (im.owned.empty()) return std::nullopt;
  return im.on_worker("sweep look", [&]() -> std::optional<long long> {
    // An event held back by an earlier one of its key that waits for a retry is found too, and
    // the drain that follows claims nothing for it. A range scan of the pending index (a plain
    // index scan: it also marks the entries of deleted row versions it passes as dead, which the
    // next walk then skips), with a generic plan: a custom plan for these bounds has the planner
    // look up the index's actual lowest entry, a walk through every entry of a row delivered
    // since the last vacuum (17-22 ms per step at 16,600 events/s, measured), which is what the
    // steps are meant to spread out.
    pqxx::work tx(*im.conn);
    tx.exec0(
        "SET LOCAL plan_cache_mode = force_generic_plan; SET LOCAL enable_seqscan = off; "
        "SET LOCAL enable_bitmapscan = off");
    const auto r = tx.exec_prepared("sweep_look", im.opt.instance_id, im.owned_literal, after, upto);
    tx.commit();
    if (r.empty()) return std::nullopt;
    return r[0][0].as<long long>();
  });
}

int PgStore::lanes_owned() const { return impl_->owned_count.load(); }

void PgStore::disconnect() {
  impl_->drop();
  impl_->done_conn.reset();
}

bool PgStore::failed_session_open() const { return impl_->conn && impl_->failed; }

void PgStore::close_failed_session() {
  if (impl_->failed) impl_->drop();
}

void PgStore::connect() {
  if (impl_->conn && !impl_->failed) return;
  close_failed_session();  // if the runner did not: its lanes go with it
  translate_errors(
      "connect",
      [&] {
        auto conn = open_session(impl_->opt.url, "worker");
        impl_->check_own_backend(*conn);  // before any lock or prepared statement
        {
          pqxx::nontransaction q(*conn);
          // Every statement of this session reads a narrow id range or a partial index; a new or
          // truncated table has no statistics yet, and a prepared statement planned then (a sequential
          // scan) would be kept until an analyze. Index scans only (schema 2's claim function says so
          // itself). Generic plans: planned once per session, not at every poll, and never with the
          // planner looking up an index's actual end for a bound near it (first_claimable says why).
          q.exec0("SET enable_seqscan = off");
          q.exec0("SET plan_cache_mode = force_generic_plan");
          // Statements of a few milliseconds at most: never worth compiling (a plan whose cost is
          // inflated by a disabled node would be, for hundreds of milliseconds).
          q.exec0("SET jit = off");
          const auto seq = q.exec_params1("SELECT pg_get_serial_sequence($1, 'id')", impl_->opt.table);
          if (seq[0].is_null()) {
            throw StoreUnavailable("table " + impl_->opt.table + " has no id sequence: run `outbox-relay migrate`",
                                   DbErrorClass::kUndefinedObject);
          }
          impl_->sequence = seq[0].as<std::string>();
          impl_->look_at_sequence_cache(q);
        }
        impl_->prepare_statements(*conn);
        // Membership: one advisory lock per live instance, counted by every peer in pg_locks.
        pqxx::nontransaction tx(*conn);
        std::uniform_int_distribution<int> pick(1, 0x7ffffffe);
        for (int tries = 0;; ++tries) {
          const int id = pick(impl_->rng);
          if (tx.exec_params1("SELECT pg_try_advisory_lock($1, $2)", impl_->member_ns, id)[0].as<bool>()) {
            impl_->member_id = id;
            break;
          }
          if (tries > 100) throw StoreUnavailable("could not take a membership lock");
        }
        impl_->conn = std::move(conn);
        impl_->set_owned({});
      },
      impl_->hints);
}

bool PgStore::rebalance() {
  connect();
  auto& im = *impl_;
  return im.on_worker("rebalance", [&] {
    // A scope of its own: its transaction ends before find_claim_function() opens one.
    const bool gained_any = [&] {
      pqxx::nontransaction tx(*im.conn);
      const auto members = tx.exec_params(
          "SELECT objid::int8 FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2 AND granted "
          "AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
          "AND classid::int8 = $1 ORDER BY objid",
          im.member_ns);
      int index = -1;
      for (std::size_t i = 0; i < members.size(); ++i) {
        if (members[i][0].as<long long>() == im.member_id) index = static_cast<int>(i);
      }
      if (index < 0) throw StoreUnavailable("this instance's membership lock is gone");
      const int n = static_cast<int>(members.size());
      std::set<int> target;
      for (int lane = index; lane < kLaneCount; lane += n) target.insert(lane);

      std::vector<int> release, wanted;
      std::set_difference(im.owned.begin(), im.owned.end(), target.begin(), target.end(), std::back_inserter(release));
      std::set_difference(target.begin(), target.end(), im.owned.begin(), im.owned.end(), std::back_inserter(wanted));
      std::set<int> owned = im.owned;
      if (!release.empty()) {
        tx.exec_params("SELECT pg_advisory_unlock($1, l) FROM unnest($2::int[]) AS l", im.lane_ns,
                       int_array(release.data(), release.data() + release.size()));
        for (int lane : release) owned.erase(lane);
      }
      std::vector<int> gained;
      if (!wanted.empty()) {
        const auto got = tx.exec_params("SELECT l FROM unnest($2::int[]) AS l WHERE pg_try_advisory_lock($1, l)",
                                        im.lane_ns, int_array(wanted.data(), wanted.data() + wanted.size()));
        for (const auto& row : got) gained.push_back(row[0].as<int>());
      }
      if (!gained.empty()) {
        // The gained lanes may hold pending rows below what this instance resolved so far (the
        // previous owner's released batch, events committed during the handover): the next claim,
        // even a poll, looks from the start again (claim_with_function: resolved < 0).
        im.state.lanes_gained();
        // Whoever held these lanes before has lost its lock (it died or handed them over between
        // batches): its leases are stale, and keeping them would let later events of a key
        // overtake the leased ones. Clear them so the rows are claimable now, in order.
        tx.exec_params("UPDATE " + im.opt.table +
                           " SET lease_owner = NULL, lease_until = NULL WHERE lane = ANY($1::smallint[]) "
                           "AND processed_at IS NULL AND dead_lettered_at IS NULL AND lease_until IS NOT NULL" +
                           kNoFlushWait,
                       int_array(gained.data(), gained.data() + gained.size()));
        owned.insert(gained.begin(), gained.end());
      }
      if (!release.empty() || !gained.empty()) {
        log::info("ordering lanes rebalanced", {{"instances", n},
                                                {"lanes_owned", owned.size()},
                                                {"lanes_gained", gained.size()},
                                                {"lanes_released", release.size()}});
      }
      im.set_owned(std::move(owned));
      im.look_at_sequence_cache(tx);
      return !gained.empty();
    }();
    return gained_any;
  });
}

std::vector<Event> PgStore::claim(std::size_t limit) { return claim_or_probe(limit, false, {}, 0); }

std::vector<Event> PgStore::claim_above(std::size_t limit, long long floor) {
  return claim_or_probe(limit, false, {}, floor);
}

std::vector<Event> PgStore::probe_claim(std::size_t limit, std::span<const Completion> completions) {
  if (impl_->owned.empty()) {  // no lanes yet
    complete(completions);
    return claim(limit);
  }
  return claim_or_probe(limit, true, completions, 0);
}

std::vector<Event> PgStore::claim_or_probe(std::size_t limit, bool probe, std::span<const Completion> completions,
                                           long long floor) {
  connect();
  auto& im = *impl_;
  if (im.owned.empty()) return {};
  return im.on_worker("claim", [&] {
    auto events = im.claim_lanes(limit, probe, completions, floor);
    std::sort(events.begin(), events.end(), [](const Event& a, const Event& b) { return a.id < b.id; });
    return events;
  });
}

std::optional<std::chrono::milliseconds> PgStore::retry_due_in() {
  connect();
  auto& im = *impl_;
  if (im.owned.empty()) return std::nullopt;
  return im.on_worker("retry look", [&]() -> std::optional<std::chrono::milliseconds> {
    // The retry index's predicate: a walk of the events that failed and still wait (at most one
    // per key: later events of a key are not attempted while an earlier one waits).
    pqxx::nontransaction tx(*im.conn);
    const auto r = tx.exec_params1("SELECT ceil(extract(epoch FROM min(next_attempt_at) - now()) * 1000)::int8 FROM " +
                                       im.opt.table +
                                       " WHERE processed_at IS NULL AND dead_lettered_at IS NULL AND attempts > 0 "
                                       "AND next_attempt_at > now() AND lane = ANY($1::smallint[])",
                                   im.owned_literal);
    if (r[0].is_null()) return std::nullopt;
    return std::chrono::milliseconds(r[0].as<long long>());
  });
}

std::vector<Event> PgStore::Impl::claim_lanes(std::size_t limit, bool probe, std::span<const Completion> completions,
                                              long long floor) {
  pqxx::nontransaction tx(*conn);
  if (state.ask_anything_new_first(probe, !completions.empty())) {
    const auto r = tx.exec_prepared1("anything_new", state.floor_id());
    if (r[0].is_null() && r[1].as<long long>() >= state.floor_id()) return {};
  }
  // The reading first, in statements of its own: the claim's snapshot comes after it.
  auto now = std::chrono::steady_clock::now();
  if (state.reading_due(now)) {
    read_writers(tx, now);
    report_holds(tx, now);
  }
  // NULL arrays when every lane is alike (no writer holds one back): the function then does no
  // per-lane work.
  const LaneBounds& lanes = state.lanes();
  const bool uniform = lanes.uniform();
  const std::string known = uniform ? std::string() : lane_literal(lanes.known());
  const std::string covered = uniform ? std::string() : lane_literal(lanes.covered());
  // The usual poll (lanes alike, no outcome to write): one statement, the function's answer.
  const bool lean = probe && uniform && lanes.resolved() >= 0 && completions.empty();
  const auto call_function = [&](std::span<const Completion> outcomes) {
    const EncodedCompletions encoded = encode_completions(outcomes);
    const auto lease_ms = static_cast<long long>(opt.lease.count());
    const char* known_arg = uniform ? nullptr : known.c_str();
    const char* covered_arg = uniform ? nullptr : covered.c_str();
    return tx.exec_prepared("claim_fn_lanes", opt.instance_id, lease_ms, owned_literal, static_cast<int>(limit),
                            lanes.resolved(), probe, encoded.delivered, encoded.others, opt.delete_on_success, floor,
                            known_arg, covered_arg, encoded.created_upto);
  };
  pqxx::result rows;
  if (lean) {
    rows = tx.exec_prepared("poll_lanes", opt.instance_id, owned_literal, static_cast<int>(limit), lanes.resolved());
  } else {
    try {
      rows = call_function(completions);
    } catch (const pqxx::sql_error& e) {
      if (completions.empty() || !row_tied_sqlstate(e.sqlstate())) throw;
      write_outcomes_one_by_one(tx, completions);
      rows = call_function({});
    }
  }
  now = std::chrono::steady_clock::now();
  return split_claim_rows(rows, [&](const pqxx::row& row, const std::vector<Event>& events) {
    const auto lane_bounds = row[11].is_null() ? std::nullopt : std::optional<LaneIds>(parse_lane_ids(row[11].c_str()));
    const LaneMask held = state.lanes_claimed(now, probe, limit, events.size(), lane_bounds, row[10].as<long long>());
    if (held == 0 && !holds.writers.empty()) {
      holds = {};
      warned.clear();
    }
  });
}

void PgStore::Impl::write_outcomes_one_by_one(pqxx::nontransaction& tx, std::span<const Completion> completions) {
  for (const Completion& c : completions) {
    const EncodedCompletions one = encode_completions({&c, 1});
    try {
      tx.exec_params(complete_sql, one.delivered, one.others, one.created_upto);
    } catch (const pqxx::sql_error& e) {
      if (!row_tied_sqlstate(e.sqlstate())) throw;
      std::string error = e.what();
      error = error.substr(0, error.find('\n'));
      const std::string reason = std::string("its outcome (") + completion_kind(c.kind) +
                                 ") could not be written: " + error + " (SQLSTATE " + e.sqlstate() + ")";
      // Not in the retry index (dead_lettered_at is set), so this write cannot fail the same way.
      tx.exec_params("UPDATE " + opt.table +
                         " SET attempts = attempts + 1, dead_lettered_at = now(), last_error = $2, "
                         "lease_owner = NULL, lease_until = NULL WHERE id = $1 AND processed_at IS NULL",
                     static_cast<long long>(c.id), reason);
      log::error("an event was dead-lettered: its outcome could not be written; the other events flow on",
                 {{"id", c.id}, {"outcome", completion_kind(c.kind)}, {"error", reason}});
    }
  }
}

void PgStore::Impl::read_writers(pqxx::nontransaction& tx, std::chrono::steady_clock::time_point now) {
  const auto rows = tx.exec_prepared("writers");
  WriterReading reading;
  // Schema 10's columns: a prepared transaction's gid, owner and database; the sequence's cache.
  const bool named = rows.columns() >= 15;
  const auto text = [](const pqxx::field& f) { return f.is_null() ? std::string() : f.as<std::string>(); };
  for (const auto& row : rows) {
    reading.last_id = row[0].as<long long>();
    if (row[1].is_null()) {
      if (named && !row[14].is_null()) reading.sequence_cache = row[14].as<long long>();
      continue;
    }
    OpenWriter w;
    w.vxid = row[1].as<std::string>();
    w.pid = row[2].is_null() ? 0 : row[2].as<int>();
    w.complete = row[3].as<bool>();
    w.lanes = static_cast<LaneMask>(row[4].as<long long>());
    w.state = row[5].is_null() ? "" : row[5].as<std::string>();
    w.xact_age_seconds = row[6].is_null() ? 0.0 : row[6].as<double>();
    w.application = row[7].is_null() ? "" : row[7].as<std::string>();
    w.client_addr = row[8].is_null() ? "" : row[8].as<std::string>();
    w.query = row[9].is_null() ? "" : row[9].as<std::string>();
    w.wait_event = row[10].is_null() ? "" : row[10].as<std::string>();
    if (named) {
      w.gid = text(row[11]);
      w.owner = text(row[12]);
      w.database = text(row[13]);
    }
    reading.writers.push_back(std::move(w));
  }
  sequence_cache_seen(reading.sequence_cache, now);
  state.writers_read(now, reading);
}

void PgStore::Impl::sequence_cache_seen(long long cache, std::chrono::steady_clock::time_point now) {
  const long long before = opt.health ? opt.health->sequence_cache.exchange(cache) : cache_seen;
  cache_seen = cache;
  if (cache > 1 && (before <= 1 || now - cache_warned_at >= kWriterWarningEvery)) {
    cache_warned_at = now;
    log::error(
        "the id sequence hands out blocks of ids (CACHE > 1): a session may draw an id below the last one drawn "
        "at any later time, so events wait for every lower id to be committed (no writer reading applies); fix it "
        "with ALTER SEQUENCE " +
            sequence + " CACHE 1, then restart the writers' sessions (their cached ids) (schema/010)",
        {{"table", opt.table}, {"sequence", sequence}, {"cache", cache}});
  } else if (cache <= 1 && before > 1) {
    log::warn(
        "the id sequence draws one id at a time again; sessions connected while it cached more may still draw "
        "ids from their blocks: restart them, or their events may go out of order (schema/010)",
        {{"table", opt.table}, {"sequence", sequence}});
  }
}

void PgStore::Impl::report_holds(pqxx::nontransaction& tx, std::chrono::steady_clock::time_point now) {
  const LaneBounds& lanes = state.lanes();
  const LaneMask held = state.held();
  const auto holding = writers_holding(lanes.last_reading(), held);
  if (holding.empty()) {
    holds = {};
    warned.clear();
    return;
  }
  // Per lane, the committed events above its bound, counted now and then.
  std::map<int, std::size_t> per_lane;
  const bool count = now - counted_at >= kHeldCountEvery;
  if (count) {
    counted_at = now;
    std::vector<int> lanes_held;
    long long low = -1;
    for (int lane = 0; lane < kLaneCount; ++lane) {
      if ((held & lane_bit(lane)) == 0) continue;
      lanes_held.push_back(lane);
      low = low < 0 ? lanes.covered()[lane] : std::min(low, lanes.covered()[lane]);
    }
    for (const auto& row :
         tx.exec_prepared("held_count", int_array(lanes_held.data(), lanes_held.data() + lanes_held.size()), low,
                          lanes.last_id(), lane_literal(lanes.covered()))) {
      per_lane[row[0].as<int>()] = row[1].as<std::size_t>();
    }
  }
  WriterHolds next;
  std::map<std::string, Warned> still;
  for (const OpenWriter* w : holding) {
    WriterHold h{*w, w->holds() & held, 0};
    if (count) {
      for (const auto& [lane, n] : per_lane) {
        if ((h.lanes & lane_bit(lane)) != 0) h.events += n;
      }
    } else {
      for (const auto& old : holds.writers) {
        if (old.writer.vxid == w->vxid) h.events = old.events;
      }
    }
    next.oldest_writer_seconds = std::max(next.oldest_writer_seconds, w->xact_age_seconds);
    auto seen = warned.find(w->vxid);
    Warned mark = seen == warned.end() ? Warned{now, std::nullopt} : seen->second;
    if (now - mark.first_seen >= opt.writer_hold_warning &&
        (!mark.warned_at || now - *mark.warned_at >= kWriterWarningEvery)) {
      mark.warned_at = now;
      log::warn(
          "an open writer transaction holds back events; it ends when the writer commits or rolls back "
          "(docs/operations.md, \"An event stream stalled: find the writer\")",
          {{"pid", w->pid},
           {"application_name", w->application},
           {"client_addr", w->client_addr},
           {"state", w->state.empty() ? "not visible (see schema/005: pg_read_all_stats)" : w->state},
           {"transaction_age_seconds", w->xact_age_seconds},
           {"query", w->query},
           {"lanes", describe_lanes(h.lanes)},
           {"events_held", h.events},
           {"lanes_known", w->complete},
           {"gid", w->gid},
           {"owner", w->owner},
           {"database", w->database}});
    }
    still.emplace(w->vxid, mark);
    next.writers.push_back(std::move(h));
  }
  if (count) {
    for (const auto& [lane, n] : per_lane) next.events += n;
  } else {
    next.events = holds.events;
  }
  holds = std::move(next);
  warned = std::move(still);
}

void PgStore::complete(std::span<const Completion> completions) {
  if (completions.empty()) return;
  // Not a failed worker session's replacement: its lanes keep these events from peers until the
  // outcomes are written (Store::failed_session_open).
  if (!impl_->conn) connect();
  auto& im = *impl_;
  const EncodedCompletions encoded = encode_completions(completions);
  try {
    translate_errors(
        "complete",
        [&] {
          if (!im.done_conn) {
            auto conn = open_session(im.opt.url, "completer");
            // As the worker session (connect()): by id = ANY(array), never a sequential scan, even with
            // a plan made while the table had no statistics (a new or truncated table: 430 ms per
            // batch of 500 in a drain of 200,000 events beside a stream, measured).
            pqxx::nontransaction(*conn).exec0("SET enable_seqscan = off");
            conn->prepare("complete", im.complete_sql);
            im.done_conn = std::move(conn);
          }
          pqxx::nontransaction tx(*im.done_conn);
          try {
            tx.exec_prepared1("complete", encoded.delivered, encoded.others, encoded.created_upto);
          } catch (const pqxx::sql_error& e) {
            if (!row_tied_sqlstate(e.sqlstate())) throw;
            im.write_outcomes_one_by_one(tx, completions);
          }
        },
        im.hints);
  } catch (const StoreUnavailable&) {
    im.done_conn.reset();  // only this session: a claim may be using the other one
    throw;
  }
}

bool PgStore::release_leases() {
  auto& im = *impl_;
  try {
    translate_errors(
        "release leases",
        [&] {
          if (!im.conn) im.conn = open_session(im.opt.url, "worker");
          pqxx::nontransaction tx(*im.conn);
          tx.exec_params("UPDATE " + im.opt.table +
                             " SET lease_owner = NULL, lease_until = NULL "
                             "WHERE lease_owner = $1 AND processed_at IS NULL AND dead_lettered_at IS NULL" +
                             kNoFlushWait,
                         im.opt.instance_id);
        },
        im.hints);
    return true;
  } catch (const StoreUnavailable& e) {
    log::warn("could not release leases at shutdown; they expire on their own", {{"error", e.what()}});
    im.drop();
    return false;
  }
}

}  // namespace outbox::pg
