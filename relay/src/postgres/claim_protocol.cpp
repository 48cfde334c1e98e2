// The claim protocol (schema 12, which `run` requires): the schema check and the session's
// statements, the lean poll while every lane is alike, the claim function lane by lane, outcomes
// written one by one when a row cannot take its own, and the sweep's look.
#include <nlohmann/json.hpp>

#include <algorithm>
#include <chrono>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "log/log.hpp"
#include "postgres/pg_store_impl.hpp"
#include "postgres/sqlstate.hpp"

namespace outbox::pg {
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
// owner, $2 the lanes, $3 the limit, $4 resolved (>= 0: every id up to it is committed or gone),
// $5 the bytes (schema 12's p_max_bytes: NULL for none).
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
// The poll's three forms share the walk (v, w) and the choice of rows ({choice}: claimable, above
// $4 and up to the walk's bound, schema 7's head-of-line rule). The head-of-line look is a range
// of (hash of the key, id) pairs, as in schema 14's claim function: only the retry index can read
// it in order, so a plan made on an empty table cannot take the pending index instead (with the
// key's equality as its bound, schema 13's form, that plan walked the pending index from its start
// for every event chosen while a retry waited).
constexpr const char* kPollHead = R"sql(
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
    FROM v),)sql";

constexpr const char* kPollChoice = R"sql(
   WHERE {claimable}
     AND c.id > $4::int8 AND c.id <= (SELECT w.bound FROM w)
     AND (NOT EXISTS (SELECT 1 FROM {table} AS r
                       WHERE r.processed_at IS NULL AND r.dead_lettered_at IS NULL AND r.attempts > 0)
          OR (SELECT b.id FROM {table} AS b
               WHERE (pg_catalog.hashtextextended(b.aggregate_id, 0), b.id)
                     >= (pg_catalog.hashtextextended(c.aggregate_id, 0), 0)
                 AND (pg_catalog.hashtextextended(b.aggregate_id, 0), b.id)
                     < (pg_catalog.hashtextextended(c.aggregate_id, 0), c.id)
                 AND b.aggregate_id = c.aggregate_id
                 AND b.processed_at IS NULL AND b.dead_lettered_at IS NULL AND b.attempts > 0
               ORDER BY pg_catalog.hashtextextended(b.aggregate_id, 0), b.id LIMIT 1) IS NULL)
   ORDER BY c.id LIMIT $3)sql";

// The usual form: one scan that locks as it goes, NOWAIT. A row that another transaction holds
// (FOR SHARE, FOR UPDATE, an operator's UPDATE) fails it with SQLSTATE 55P03, and the poll runs
// the careful form instead (claim_lanes). FOR NO KEY UPDATE: a foreign key's check (FOR KEY SHARE)
// holds nothing. No byte cut: the rows go out whole when they fit in $5, as 255 times their stored
// sizes (a cheap bound: no compression method read) or else as the cut counts them ({bytes(x)});
// when they do not, it answers nothing at all, not even the summary row, and the poll runs the form
// that cuts (kPollCutting). The cut (the rows materialised, sorted again, summed by a window, and
// counted for the summary) cost ~55 us of Postgres CPU a poll of 8 events at 1,000 events/s
// (bench/RESULTS.md, "The lean poll without its byte cut").
constexpr const char* kPollFitting = R"sql(
l AS (
  SELECT c.id, c.topic, c.aggregate_id, c.payload, c.headers, c.created_at, c.attempts, c.sinks_done
    FROM {table} AS c{choice}
     FOR NO KEY UPDATE OF c NOWAIT)
SELECT u.* FROM (
  SELECT s.id, s.topic, s.aggregate_id, s.payload::text, s.headers::text, NULL::text,
         {created_us(s)}, s.attempts, s.sinks_done,
         NULL::int8, NULL::int8, NULL::int8[]
    FROM l AS s
  UNION ALL
  SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, w.bound, w.last, ARRAY[w.bound]
    FROM w) AS u
 WHERE $5::int8 IS NULL
    OR (SELECT 255 * coalesce(sum(octet_length(x.topic) + octet_length(x.aggregate_id)
                                  + pg_column_size(x.headers)::int8 + pg_column_size(x.payload)), 0)
          FROM l AS x) <= $5::int8
    OR (SELECT coalesce(sum({bytes(x)}), 0) FROM l AS x) <= $5::int8)sql";

// The form that cuts, when the rows chosen do not fit (kPollFitting answered nothing): as that
// one, and the rows past the byte cut ({cut}) are locked and not returned; the bound stops at the
// last row returned.
constexpr const char* kPollCutting = R"sql(
l AS (
  SELECT c.id, c.topic, c.aggregate_id, c.payload, c.headers, c.created_at, c.attempts, c.sinks_done,
         {bytes(c)} AS bytes
    FROM {table} AS c{choice}
     FOR NO KEY UPDATE OF c NOWAIT),
{cut(l, s)}
SELECT s.id, s.topic, s.aggregate_id, s.payload::text, s.headers::text, NULL::text,
       {created_us(s)}, s.attempts, s.sinks_done,
       NULL::int8, NULL::int8, NULL::int8[]
  FROM s
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, w.bound, w.last,
       ARRAY[CASE WHEN (SELECT count(*) FROM s) < (SELECT count(*) FROM l) THEN (SELECT max(x.id) FROM s AS x)
                  ELSE w.bound END]
  FROM w)sql";

// The careful form, as {prefix}_claim (schemas 10 and 12): the rows chosen and cut by bytes, then
// locked (SKIP LOCKED); a row that could not be locked stops its lane there (nothing of the lane
// above it, the lane's bound below it), and the next claim looks from it again.
constexpr const char* kPollSkipping = R"sql(
candidates AS MATERIALIZED (
  SELECT c.id, c.lane::smallint AS lane, {bytes(c)} AS bytes
    FROM {table} AS c{choice}),
{cut(candidates, chosen)},
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
    FROM chosen AS ch
   WHERE (SELECT count(*) FROM locked) < (SELECT count(*) FROM chosen)
     AND NOT (ch.id = ANY(ARRAY(SELECT k.id FROM locked AS k)))
   GROUP BY ch.lane)
SELECT k.id, k.topic, k.aggregate_id, k.payload::text, k.headers::text, NULL::text,
       {created_us(k)}, k.attempts, k.sinks_done,
       NULL::int8, NULL::int8, NULL::int8[]
  FROM locked AS k
 WHERE NOT EXISTS (SELECT 1 FROM stop AS x WHERE x.lane = k.lane AND x.first < k.id)
UNION ALL
SELECT NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, w.bound, w.last,
       CASE WHEN NOT EXISTS (SELECT 1 FROM stop) AND (SELECT count(*) FROM candidates) = (SELECT count(*) FROM chosen)
            THEN ARRAY[w.bound]
            ELSE (SELECT array_agg(least(w.bound,
                                         coalesce((SELECT x.first - 1 FROM stop AS x WHERE x.lane = g.n), w.bound),
                                         CASE WHEN (SELECT count(*) FROM chosen) >= $3
                                                   OR (SELECT count(*) FROM candidates) > (SELECT count(*) FROM chosen)
                                              THEN (SELECT max(ch.id) FROM chosen AS ch) ELSE w.bound END)
                                   ORDER BY g.n)
                    FROM generate_series(0, 63) AS g(n)) END
  FROM w)sql";

// An event's bytes (table alias @), as schema 12's claim counts them: its topic's and key's
// lengths, its headers and payload as stored, a compressed value times the most its method can
// stand for (pglz 88, lz4 255), so that the bound holds whatever the payload without fetching or
// decompressing anything.
constexpr const char* kEventBytes =
    "(octet_length(@.topic) + octet_length(@.aggregate_id) "
    "+ pg_column_size(@.headers)::int8 * CASE pg_column_compression(@.headers) "
    "WHEN 'pglz' THEN 88 WHEN 'lz4' THEN 255 ELSE 1 END "
    "+ pg_column_size(@.payload)::int8 * CASE pg_column_compression(@.payload) "
    "WHEN 'pglz' THEN 88 WHEN 'lz4' THEN 255 ELSE 1 END)";

// The byte cut (schema 12's, with $5 its bound: NULL for none): `to` is `from`'s rows, in id order,
// while the bytes before each are under $5 (the first always goes).
std::string byte_cut(const std::string& from, const std::string& to) {
  return to +
         " AS MATERIALIZED (\n  SELECT r.* FROM (SELECT f.*, sum(f.bytes) OVER (ORDER BY f.id) - f.bytes AS before "
         "FROM " +
         from + " AS f) AS r\n   WHERE $5::int8 IS NULL OR r.before < $5::int8)";
}

// An event's created_at in microseconds since the epoch, NULL unless it is a time the relay can
// carry: RFC 3339 has years 0001-9999, and infinity made the cast to int8 fail the whole claim
// (every key stalled on one row). The loop dead-letters an event without it (schema 11 makes the
// claim function's column the same).
std::string created_us(const char* alias) {
  std::string sql =
      "CASE WHEN extract(epoch FROM @.created_at) BETWEEN -62135596800 AND 253402300799.999999 "
      "THEN (extract(epoch FROM @.created_at) * 1000000)::int8 END";
  replace_all(sql, "@", alias);
  return sql;
}

// An event's bytes as kEventBytes counts them, for table alias `alias`.
std::string event_bytes(const char* alias) {
  std::string sql = kEventBytes;
  replace_all(sql, "@", alias);
  return sql;
}

// The lean poll's three forms, in the order a poll tries them.
enum class PollForm { kFitting, kCutting, kSkipping };

std::string lane_poll_sql(const std::string& table, const std::string& sequence_literal, PollForm form) {
  std::string sql = std::string(kPollHead) + (form == PollForm::kFitting   ? kPollFitting
                                              : form == PollForm::kCutting ? kPollCutting
                                                                           : kPollSkipping);
  replace_all(sql, "{cut(l, s)}", byte_cut("l", "s"));
  replace_all(sql, "{cut(candidates, chosen)}", byte_cut("candidates", "chosen"));
  replace_all(sql, "{bytes(c)}", event_bytes("c"));
  replace_all(sql, "{bytes(x)}", event_bytes("x"));
  replace_all(sql, "{created_us(s)}", created_us("s"));
  replace_all(sql, "{created_us(k)}", created_us("k"));
  replace_all(sql, "{choice}", kPollChoice);
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
  if (row[6].is_null()) {
    e.created_at_us = 0;  // not a time the relay can carry (created_us): the loop dead-letters it
  } else {
    e.created_at_us = row[6].as<long long>();
    if (row[5].is_null()) {
      e.created_at = rfc3339_utc(e.created_at_us);  // schema 2: formatted here, not per row in Postgres
    } else {
      e.created_at.assign(row[5].c_str(), row[5].size());
    }
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

}  // namespace

void PgStore::Impl::prepare_statements(pqxx::connection& c) {
  const std::string name = names.function("claim");
  {
    pqxx::nontransaction q(c);
    // The schema this relay was built for: its claim function, and kSchemaVersion recorded where
    // the relay's role may read the migrations' table (a later schema may change only what the
    // claim does not call, as 11 did). An older one is refused (`migrate` first: it runs online,
    // writers and older relays keep working through it).
    const auto r = q.exec_params1(
        "SELECT to_regprocedure($1) IS NOT NULL, "
        "coalesce(has_table_privilege(to_regclass($2), 'SELECT'), false)",
        name + kClaimFunctionArgs, names.migrations);
    int version = -1;
    if (r[1].as<bool>()) {
      const auto v = q.exec_params1(
          "SELECT coalesce(max(m.version), 0) FROM " + names.migrations + " AS m WHERE m.table_name = $1", opt.table);
      version = v[0].as<int>();
    }
    // 0: nothing recorded under this spelling of the table's name (migrated as `outbox_events`, run
    // as `public.outbox_events`): the function decides.
    if (!r[0].as<bool>() || (version > 0 && version < kSchemaVersion)) throw SchemaTooOld(opt.table, version);
    if (auto other = functions_of_another_table(q, name + kClaimFunctionArgs, names.table)) {
      throw AmbiguousTable("database.table '" + opt.table + "': " + *other);
    }
    // Table features that change what the relay's statements do, which it cannot work around: a
    // rule rewrites them (ON UPDATE DO INSTEAD NOTHING swallowed every mark: each event was sent
    // again at every claim from the start), and an unlogged table loses its events in a crash.
    // Refused at each connect, loudly (the error in the log, /readyz 503), until they are gone.
    // Row-level security needs no look: the session's row_security = off makes it an error.
    // A row trigger BEFORE UPDATE or DELETE may be an operator's benign one (an audit column), so
    // it is named in a warning at each connect rather than refused: one that returns NULL, or sets
    // processed_at back, makes the relay's marks do nothing, and each event goes out again at
    // every claim (tgtype: 1 row, 2 before, 8 delete, 16 update; enabled as origin or always).
    const auto f = q.exec_params1(
        "SELECT (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(r.rulename), ', ' ORDER BY r.rulename) "
        "          FROM pg_catalog.pg_rewrite AS r WHERE r.ev_class = c.oid), c.relpersistence = 'u', "
        "       (SELECT pg_catalog.string_agg(pg_catalog.quote_ident(t.tgname), ', ' ORDER BY t.tgname) "
        "          FROM pg_catalog.pg_trigger AS t WHERE t.tgrelid = c.oid AND NOT t.tgisinternal "
        "           AND t.tgenabled IN ('O', 'A') AND (t.tgtype & 3) = 3 AND (t.tgtype & 24) <> 0) "
        "  FROM pg_catalog.pg_class AS c WHERE c.oid = $1::pg_catalog.regclass",
        names.table);
    if (!f[2].is_null()) {
      log::warn(
          "the outbox table has row triggers that run before the relay's marks and deletes: one that "
          "returns NULL or sets processed_at back makes a mark do nothing, and that event is sent again at "
          "every claim; make them leave the relay's updates alone (or AFTER triggers)",
          {{"table", opt.table}, {"triggers", f[2].as<std::string>()}});
    }
    if (!f[0].is_null()) {
      throw StoreUnavailable("table " + opt.table + " has rules (" + f[0].as<std::string>() +
                                 "), which rewrite the relay's statements (a rule ON UPDATE can swallow its marks, "
                                 "and every event is sent again and again); the relay claims nothing while they exist",
                             DbErrorClass::kConfiguration, "DROP RULE ... ON " + opt.table);
    }
    if (f[1].as<bool>()) {
      throw StoreUnavailable("table " + opt.table +
                                 " is UNLOGGED: a crash of Postgres empties it, and the events "
                                 "in it are lost; the relay claims nothing from it",
                             DbErrorClass::kConfiguration, "ALTER TABLE " + opt.table + " SET LOGGED");
    }
  }
  c.prepare("claim_fn_lanes", "SELECT * FROM " + name +
                                  "($1, $2, $3::smallint[], $4, $5, $6, $7::bigint[], $8::jsonb, $9, $10, "
                                  "$11::bigint[], $12::bigint[], $13::timestamptz, $14::bigint)");
  c.prepare("poll_lanes", lane_poll_sql(names.table, c.quote(sequence), PollForm::kFitting));
  c.prepare("poll_lanes_cutting", lane_poll_sql(names.table, c.quote(sequence), PollForm::kCutting));
  c.prepare("poll_lanes_skipping", lane_poll_sql(names.table, c.quote(sequence), PollForm::kSkipping));
  c.prepare("writers", "SELECT * FROM " + names.function("writers") + "()");
  // The committed events of held lanes above their bounds (the metrics' held events).
  c.prepare("held_count", "SELECT c.lane, count(*) FROM " + names.table +
                              " AS c "
                              "WHERE c.processed_at IS NULL AND c.dead_lettered_at IS NULL "
                              "AND c.lane = ANY($1::smallint[]) AND c.id > $2 AND c.id <= $3 "
                              "AND c.id > ($4::bigint[])[c.lane + 1] GROUP BY c.lane");
  // With the last id drawn: one below $1 means the sequence was set back (LaneBounds), and the
  // claim must run to say so.
  c.prepare("anything_new", "SELECT (SELECT id FROM " + names.table +
                                " WHERE id > $1 ORDER BY id LIMIT 1), "
                                "coalesce(pg_sequence_last_value(" +
                                c.quote(sequence) + "::regclass), 0)");
  // The sweep's look (first_claimable): the claim's predicate, without the head-of-line look.
  c.prepare("sweep_look", "SELECT c.id FROM " + names.table + " AS c WHERE " + claimable_rows("$1", "$2") +
                              "AND c.id > $3 AND c.id <= $4 ORDER BY c.id LIMIT 1");
}

SchemaTooOld::SchemaTooOld(const std::string& table, int version)
    : StoreUnavailable(
          "table " + table + " is at " +
              (version < 0    ? std::string("a schema version older than ")
               : version == 0 ? std::string("schema version 0 (not migrated); this relay needs version ")
                              : "schema version " + std::to_string(version) + "; this relay needs version ") +
              std::to_string(kSchemaVersion) +
              ": run `outbox-relay migrate` with the same config first (it runs online; writers and "
              "relays of the previous version keep working through it)",
          DbErrorClass::kUndefinedObject,
          // A hint of its own: translate_errors passes it on as it is (run.cpp tells it apart).
          "run `outbox-relay migrate` with the same config") {}

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

std::vector<EventId> PgStore::still_pending(std::span<const EventId> ids) {
  if (ids.empty()) return {};
  connect();
  auto& im = *impl_;
  const std::string literal = int_array(ids.data(), ids.data() + ids.size());
  return im.on_worker("still-pending look", [&] {
    pqxx::work tx(*im.conn);
    // A deleted row (delete_on_success) or one delivered or dead-lettered is not pending.
    const auto r = tx.exec_params("SELECT id FROM " + im.names.table +
                                      " WHERE id = ANY($1::bigint[]) AND processed_at IS NULL"
                                      " AND dead_lettered_at IS NULL ORDER BY id",
                                  literal);
    tx.commit();
    std::vector<EventId> pending;
    pending.reserve(r.size());
    for (const auto& row : r) pending.push_back(row[0].as<EventId>());
    return pending;
  });
}

std::vector<Event> PgStore::claim(std::size_t limit) { return claim_or_probe(limit, false, {}, 0); }

std::vector<Event> PgStore::claim_above(std::size_t limit, long long floor) {
  return claim_or_probe(limit, false, {}, floor);
}

void PgStore::limit_claim_bytes(std::size_t bytes) { impl_->claim_bytes.store(bytes); }

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
                                       im.names.table +
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
  const std::size_t max_bytes = claim_bytes.load();  // 0: no bound (NULL)
  const std::string max_bytes_text = std::to_string(max_bytes);
  const char* max_bytes_arg = max_bytes == 0 ? nullptr : max_bytes_text.c_str();
  const auto call_function = [&](std::span<const Completion> outcomes) {
    const EncodedCompletions encoded = encode_completions(outcomes);
    const auto lease_ms = static_cast<long long>(opt.lease.count());
    const char* known_arg = uniform ? nullptr : known.c_str();
    const char* covered_arg = uniform ? nullptr : covered.c_str();
    return tx.exec_prepared("claim_fn_lanes", opt.instance_id, lease_ms, owned_literal, static_cast<int>(limit),
                            lanes.resolved(), probe, encoded.delivered, encoded.others, opt.delete_on_success, floor,
                            known_arg, covered_arg, encoded.created_upto, max_bytes_arg);
  };
  pqxx::result rows;
  if (lean) {
    const auto poll = [&](const char* form) {
      return tx.exec_prepared(form, opt.instance_id, owned_literal, static_cast<int>(limit), lanes.resolved(),
                              max_bytes_arg);
    };
    try {
      rows = poll("poll_lanes");
      // No summary row: the rows chosen do not fit in the bytes, and the form that cuts them runs.
      if (rows.empty()) rows = poll("poll_lanes_cutting");
    } catch (const pqxx::sql_error& e) {
      if (e.sqlstate() != "55P03") throw;  // lock_not_available: a row another transaction holds
      rows = poll("poll_lanes_skipping");
    }
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
      tx.exec_params("UPDATE " + names.table +
                         " SET attempts = attempts + 1, dead_lettered_at = now(), last_error = $2, "
                         "lease_owner = NULL, lease_until = NULL WHERE id = $1 AND processed_at IS NULL",
                     static_cast<long long>(c.id), reason);
      log::error("an event was dead-lettered: its outcome could not be written; the other events flow on",
                 {{"id", c.id}, {"outcome", completion_kind(c.kind)}, {"error", reason}});
    }
  }
}

}  // namespace outbox::pg
