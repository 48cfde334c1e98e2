#include "postgres/pg_store.hpp"

#include <cstdio>
#include <ctime>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "log/log.hpp"
#include "postgres/pg_store_impl.hpp"

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

std::string lane_literal(const LaneIds& ids) { return int_array(ids.data(), ids.data() + ids.size()); }

// Complete: one autocommit statement (one round trip, one commit) for a whole batch: $1 the
// delivered ids, marked or deleted; $2 the other outcomes as a JSON array. Unreferenced
// data-modifying CTEs still run. The commit does not wait for the WAL flush (kNoFlushWait): the
// drain waits for this statement before it claims again, so a flush stalled by other I/O
// (100-400 ms on a busy VM) held back every event behind it. Except with lane groups (Kafka exactly
// once): see complete_statement.
namespace {
std::string complete_statement(const std::string& t, bool delete_on_success, bool durable) {
  std::string sql = R"sql(
WITH done AS ({done}),
failed AS (
  UPDATE {table} AS e
     SET attempts = e.attempts + CASE WHEN r.kind = 'release' THEN 0 ELSE 1 END,
         next_attempt_at = CASE WHEN r.kind = 'retry' THEN now() + r.delay_ms * interval '1 millisecond'
                                ELSE e.next_attempt_at END,
         last_error = COALESCE(r.error, e.last_error),
         dead_lettered_at = CASE WHEN r.kind = 'dead' THEN now() ELSE NULL END,
         sinks_done = r.sinks_done, lease_owner = NULL, lease_until = NULL
    FROM jsonb_to_recordset($2::jsonb) AS r(id bigint, kind text, delay_ms bigint, error text, sinks_done text[])
   WHERE e.id = r.id AND e.processed_at IS NULL AND e.created_at <= $3::timestamptz
     AND e.id = ANY(ARRAY(SELECT (f->>'id')::bigint FROM jsonb_array_elements($2::jsonb) AS f)))
SELECT set_config('synchronous_commit', '{sync}', true)
)sql";
  // durable (Kafka exactly once): a sink trims what it keeps downstream once the outcome is
  // written, so the outcome must survive a crash of Postgres itself.
  replace_all(sql, "{sync}", durable ? "on" : "off");
  replace_all(sql, "{done}",
              delete_on_success ? "DELETE FROM {table} WHERE id = ANY($1::bigint[]) AND created_at <= $3::timestamptz"
                                : "UPDATE {table} SET processed_at = now(), lease_owner = NULL, lease_until = NULL "
                                  "WHERE id = ANY($1::bigint[]) AND processed_at IS NULL "
                                  "AND created_at <= $3::timestamptz");
  replace_all(sql, "{table}", t);
  return sql;
}
}  // namespace

PgStore::PgStore(PgStoreOptions options) : impl_(std::make_unique<Impl>()) {
  impl_->opt = std::move(options);
  impl_->hints = {url_user(impl_->opt.url), impl_->opt.table};
  const std::string& t = impl_->opt.table;
  // Until the first connect resolves them (the table may not exist yet): the names as configured.
  impl_->names = {t, function_prefix(t), "outbox_schema_migrations", false, "", "", ""};
  impl_->complete_sql = complete_statement(t, impl_->opt.delete_on_success, impl_->opt.lane_groups > 0);
}

PgStore::~PgStore() = default;

bool PgStore::waiting_for_writers() const { return impl_->state.fenced(); }

std::optional<long long> PgStore::watch_from() const { return impl_->state.watch_from(impl_->conn != nullptr); }

bool PgStore::reading_pending() const { return impl_->state.reading_pending(); }

WriterHolds PgStore::writer_holds() const { return impl_->holds; }

std::optional<long long> PgStore::sweep_upto() const { return impl_->state.sweep_upto(impl_->conn != nullptr); }

int PgStore::lanes_owned() const { return impl_->owned_count.load(); }

void PgStore::disconnect() {
  impl_->drop();
  impl_->done_conn.reset();
}

bool PgStore::failed_session_open() const { return impl_->conn && impl_->failed; }

void PgStore::close_failed_session() {
  if (impl_->failed) impl_->drop();
}

namespace {
// The cluster's system identifier (kept by its physical replicas, new after pg_upgrade or a
// restore from a dump), the database and the table: what a downstream progress mark names.
// q: autocommit, so that a refused call leaves the session usable.
std::string table_identity(pqxx::nontransaction& q, const std::string& lock_key) {
  std::string cluster = "-";
  try {
    cluster = q.exec1("SELECT system_identifier::text FROM pg_catalog.pg_control_system()")[0].as<std::string>();
  } catch (const pqxx::sql_error&) {
    // A service that revoked pg_control_system(): the database and the table still tell most apart.
  }
  return cluster + "/" + q.exec1("SELECT pg_catalog.current_database()")[0].as<std::string>() + "/" + lock_key;
}
}  // namespace

std::string PgStore::identity() const { return impl_->identity; }

void PgStore::connect() {
  if (impl_->conn && !impl_->failed) return;
  close_failed_session();  // if the runner did not: its lanes go with it
  translate_errors(
      "connect",
      [&] {
        if (!impl_->names.found) {
          impl_->names = table_names(impl_->opt.url, impl_->opt.table);
          impl_->complete_sql =
              complete_statement(impl_->names.table, impl_->opt.delete_on_success, impl_->opt.lane_groups > 0);
          // Namespaces of the table, not of its name as configured: relays of two tables of one
          // name in two schemas do not count each other as members nor take each other's lanes.
          impl_->member_ns = advisory_key("outbox-relay:members:" + impl_->names.lock_key);
          impl_->lane_ns = advisory_key("outbox-relay:lanes:" + impl_->names.lock_key);
          impl_->groups_ns = advisory_key("outbox-relay:lane-groups:" + impl_->names.lock_key);
        }
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
          const auto seq = q.exec_params1("SELECT pg_get_serial_sequence($1, 'id')", impl_->names.table);
          if (seq[0].is_null()) {
            throw StoreUnavailable("table " + impl_->opt.table + " has no id sequence: run `outbox-relay migrate`",
                                   DbErrorClass::kUndefinedObject);
          }
          impl_->sequence = seq[0].as<std::string>();
          impl_->look_at_sequence_cache(q);
          if (impl_->opt.lane_groups > 0) impl_->identity = table_identity(q, impl_->names.lock_key);
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
        // How this member divides the lanes, for its peers to compare (rebalance()).
        tx.exec_params("SELECT pg_advisory_lock_shared($1, $2)", impl_->groups_ns, impl_->opt.lane_groups);
        impl_->conn = std::move(conn);
        impl_->set_owned({});
      },
      impl_->hints);
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
          tx.exec_params("UPDATE " + im.names.table +
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
