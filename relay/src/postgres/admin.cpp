#include "postgres/admin.hpp"

#include <algorithm>
#include <limits>
#include <stdexcept>

#include "postgres/session.hpp"
#include "postgres/sqlstate.hpp"

namespace outbox::pg {
namespace {

// Maintenance sessions never wait long: a stuck statement must not pin a timer thread.
constexpr const char* kSessionLimits =
    "SET statement_timeout = '30s'; SET lock_timeout = '5s'; SET idle_in_transaction_session_timeout = '60s'";

void limit_session(pqxx::connection& conn) {
  pqxx::nontransaction tx(conn);
  tx.exec(kSessionLimits);
  tx.commit();
}

// A timer thread's statement with {table} replaced by the table's resolved name.
std::string with_table(std::string sql, const std::string& url, const std::string& table) {
  replace_all(sql, "{table}", table_names(url, table).table);
  return sql;
}

// Opens the long-lived session of a timer thread (metrics, retention) if it is not open; the
// caller resets it after a failure so the next tick reconnects.
void background_session(std::unique_ptr<pqxx::connection>& conn, const std::string& url, const char* role) {
  if (conn) return;
  auto fresh = open_session(url, role);
  limit_session(*fresh);
  conn = std::move(fresh);
}

// A DbError of the failure's class; for a class that needs an operator the message ends with the
// hint, so that a command line user sees what to do.
[[noreturn]] void fail(const char* what, const std::exception& e, const std::string& url, const std::string& table) {
  throw admin_failure(what, e, url, table);
}

// The relay's own timers log the hint as a field of its own.
[[noreturn]] void fail_quietly(const char* what, const std::exception& e, const std::string& url,
                               const std::string& table) {
  throw admin_failure(what, e, url, table, false);
}

// Runs one batched write until a batch comes back short. `batch` runs in its own transaction,
// gets the cursor (the highest id handled so far) and returns the ids it changed.
template <class Batch>
IdRanges in_batches(pqxx::connection& conn, long long cursor, Batch&& batch) {
  IdRanges changed;
  for (;;) {
    pqxx::work tx(conn);
    const auto rows = batch(tx, cursor);
    tx.commit();
    std::vector<long long> ids;
    ids.reserve(rows.size());
    for (const auto& row : rows) ids.push_back(row[0].template as<long long>());
    std::sort(ids.begin(), ids.end());
    for (long long id : ids) changed.add(id);
    if (!ids.empty()) cursor = ids.back();
    if (rows.size() < kAdminBatch) break;
  }
  return changed;
}

}  // namespace

DbError admin_failure(const char* what, const std::exception& e, const std::string& url, const std::string& table,
                      bool hint_in_message) {
  const DbErrorClass kind = classify_error(e);
  std::string hint = operator_hint(kind, url_user(url), table);
  std::string message = std::string(what) + " failed: " + describe_error(e);
  if (hint_in_message && !hint.empty()) message += "; hint: " + hint;
  return DbError(message, kind, std::move(hint));
}

namespace {

// The writers that may hold events back, from the table's reading function (schema/005), oldest
// first; none before that schema.
std::vector<OpenWriterStatus> query_open_writers(pqxx::transaction_base& tx, const TableNames& names) {
  const std::string& table = names.table;
  const std::string fn = names.function("writers");
  if (tx.exec_params1("SELECT to_regprocedure($1) IS NULL", fn + "()")[0].as<bool>()) return {};
  const auto rows = tx.exec(
      "SELECT w.pid, coalesce(w.application_name, ''), coalesce(w.client_addr, ''), coalesce(w.state, ''), "
      "  coalesce(w.query, ''), coalesce(w.wait_event, ''), coalesce(w.xact_age_seconds, 0), w.complete, w.lanes, "
      "  (SELECT count(*) FROM " +
      table +
      " AS c WHERE c.processed_at IS NULL AND c.dead_lettered_at IS NULL "
      "     AND (NOT w.complete OR (w.lanes & (1::bigint << c.lane)) <> 0) "
      "     AND c.created_at >= clock_timestamp() - coalesce(w.xact_age_seconds, 0) * interval '1 second'), "
      // Schema 10's columns, NULL before it.
      "  coalesce(to_jsonb(w) ->> 'gid', ''), coalesce(to_jsonb(w) ->> 'owner', ''), "
      "  coalesce(to_jsonb(w) ->> 'database', '') "
      "FROM " +
      fn +
      "() AS w WHERE w.vxid IS NOT NULL AND (w.lanes <> 0 OR NOT w.complete) "
      "ORDER BY w.xact_age_seconds DESC NULLS LAST LIMIT 20");
  std::vector<OpenWriterStatus> out;
  for (const auto& row : rows) {
    OpenWriterStatus w;
    w.pid = row[0].is_null() ? 0 : row[0].as<int>();
    w.application_name = row[1].as<std::string>();
    w.client_addr = row[2].as<std::string>();
    w.state = row[3].as<std::string>();
    w.query = row[4].as<std::string>();
    w.wait_event = row[5].as<std::string>();
    w.xact_age_seconds = row[6].as<double>();
    w.lanes_known = row[7].as<bool>();
    const auto mask = static_cast<std::uint64_t>(row[8].as<long long>());
    for (int lane = 0; lane < 64; ++lane) {
      if ((mask >> lane) & 1U) w.lanes.push_back(lane);
    }
    w.events_held = row[9].as<long long>();
    w.gid = row[10].as<std::string>();
    w.owner = row[11].as<std::string>();
    w.database = row[12].as<std::string>();
    out.push_back(std::move(w));
  }
  return out;
}

}  // namespace

StatusReport query_status(const std::string& url, const std::string& table) {
  try {
    const TableNames names = table_names(url, table);
    auto conn = open_session(url, "status");
    pqxx::read_transaction tx(*conn);
    const auto rows = tx.exec(
        "SELECT topic, count(*) FILTER (WHERE dead_lettered_at IS NULL), "
        "  coalesce(extract(epoch FROM now() - min(created_at) FILTER (WHERE dead_lettered_at IS NULL)), 0)::float8, "
        "  count(*) FILTER (WHERE dead_lettered_at IS NOT NULL) "
        "FROM " +
        names.table + " WHERE processed_at IS NULL GROUP BY topic ORDER BY topic");
    StatusReport report;
    for (const auto& row : rows) {
      TopicStatus t;
      t.topic = row[0].as<std::string>();
      t.pending = row[1].as<long long>();
      t.oldest_pending_age_seconds = row[2].as<double>();
      t.dead_lettered = row[3].as<long long>();
      report.pending += t.pending;
      report.dead_lettered += t.dead_lettered;
      report.oldest_pending_age_seconds = std::max(report.oldest_pending_age_seconds, t.oldest_pending_age_seconds);
      report.topics.push_back(std::move(t));
    }
    report.open_writers = query_open_writers(tx, names);
    return report;
  } catch (const std::exception& e) {
    fail("status", e, url, table);
  }
}

void IdRanges::add(long long id) {
  ++count_;
  if (!ranges_.empty() && ranges_.back().second + 1 == id) {
    ranges_.back().second = id;
  } else {
    ranges_.emplace_back(id, id);
  }
}

std::string IdRanges::describe(std::size_t max_ranges) const {
  if (ranges_.empty()) return "none";
  std::string out;
  const std::size_t shown = std::min(max_ranges, ranges_.size());
  for (std::size_t i = 0; i < shown; ++i) {
    const auto& [first, last] = ranges_[i];
    if (i > 0) out += ", ";
    out += std::to_string(first);
    if (last != first) out += "-" + std::to_string(last);
  }
  if (shown < ranges_.size()) out += ", ... (" + std::to_string(ranges_.size() - shown) + " more ranges)";
  return out;
}

DeadLetterPage list_dead_letters(const std::string& url, const std::string& table,
                                 const std::optional<std::string>& topic, long long limit) {
  try {
    const std::string t = table_names(url, table).table;
    auto conn = open_session(url, "failed list");
    pqxx::read_transaction tx(*conn);
    const auto rows = tx.exec_params(
        "SELECT id, topic, aggregate_id, attempts, "
        "  to_char(dead_lettered_at AT TIME ZONE 'UTC', 'YYYY-MM-DD\"T\"HH24:MI:SS.US\"Z\"'), "
        "  coalesce(last_error, ''), count(*) OVER () "
        "FROM " +
            t +
            " WHERE dead_lettered_at IS NOT NULL AND processed_at IS NULL "
            "  AND (NOT $2 OR topic = $1) "
            "ORDER BY id LIMIT $3",
        topic.value_or(""), topic.has_value(), limit);
    DeadLetterPage page;
    for (const auto& row : rows) {
      DeadLetter d;
      d.id = row[0].as<long long>();
      d.topic = row[1].as<std::string>();
      d.key = row[2].as<std::string>();
      d.attempts = row[3].as<int>();
      d.dead_lettered_at = row[4].as<std::string>();
      d.last_error = row[5].as<std::string>();
      page.total = row[6].as<long long>();
      page.rows.push_back(std::move(d));
    }
    if (page.rows.empty() && limit > 0) page.total = 0;
    return page;
  } catch (const std::exception& e) {
    fail("failed list", e, url, table);
  }
}

void request_reload(const std::string& url, const std::string& table, const std::string& channel) {
  try {
    auto conn = open_session(url, "reload");
    pqxx::nontransaction(*conn).exec_params("SELECT pg_notify($1, 'reload')", channel);
  } catch (const std::exception& e) {
    fail("reload", e, url, table);
  }
}

IdRanges retry_dead_letters(const std::string& url, const std::string& table, const std::string& channel,
                            const RetrySelection& selection) {
  try {
    const std::string t = table_names(url, table).table;
    auto conn = open_session(url, "failed retry");
    const std::string ids = int_array(selection.ids.data(), selection.ids.data() + selection.ids.size());
    const bool by_ids = !selection.ids.empty();
    return in_batches(*conn, 0, [&](pqxx::work& tx, long long cursor) {
      auto rows =
          tx.exec_params("WITH picked AS (SELECT id FROM " + t +
                             " WHERE dead_lettered_at IS NOT NULL AND processed_at IS NULL "
                             "    AND id > $1 AND (NOT $3 OR topic = $2) AND (NOT $5 OR id = ANY($4::bigint[])) "
                             "    ORDER BY id LIMIT $6 FOR UPDATE) "
                             "UPDATE " +
                             t +
                             " AS e SET dead_lettered_at = NULL, attempts = 0, next_attempt_at = '-infinity', "
                             "  lease_owner = NULL, lease_until = NULL "
                             "FROM picked WHERE e.id = picked.id RETURNING e.id",
                         cursor, selection.topic.value_or(""), selection.topic.has_value(), ids, by_ids,
                         static_cast<long long>(kAdminBatch));
      if (!rows.empty()) tx.exec_params("SELECT pg_notify($1, '')", channel);
      return rows;
    });
  } catch (const std::exception& e) {
    fail("failed retry", e, url, table);
  }
}

IdRanges purge_dead_letters(const std::string& url, const std::string& table, std::chrono::milliseconds older_than,
                            const std::optional<std::string>& topic) {
  try {
    const std::string t = table_names(url, table).table;
    auto conn = open_session(url, "failed purge");
    return in_batches(*conn, 0, [&](pqxx::work& tx, long long cursor) {
      return tx.exec_params("DELETE FROM " + t +
                                " WHERE id = ANY(ARRAY("
                                "  SELECT id FROM " +
                                t +
                                " WHERE dead_lettered_at IS NOT NULL AND processed_at IS NULL "
                                "    AND dead_lettered_at < now() - $1 * interval '1 millisecond' "
                                "    AND id > $2 AND (NOT $4 OR topic = $3) "
                                "    ORDER BY id LIMIT $5 FOR UPDATE)) "
                                "RETURNING id",
                            static_cast<long long>(older_than.count()), cursor, topic.value_or(""), topic.has_value(),
                            static_cast<long long>(kAdminBatch));
    });
  } catch (const std::exception& e) {
    fail("failed purge", e, url, table);
  }
}

IdRanges replay_processed(const std::string& url, const std::string& table, const std::string& channel,
                          long long from_id, std::optional<long long> to_id, const std::optional<std::string>& topic) {
  try {
    const std::string t = table_names(url, table).table;
    auto conn = open_session(url, "replay");
    const long long last = to_id.value_or(std::numeric_limits<long long>::max());
    return in_batches(*conn, from_id - 1, [&](pqxx::work& tx, long long cursor) {
      auto rows = tx.exec_params(
          "WITH picked AS (SELECT id FROM " + t +
              " WHERE processed_at IS NOT NULL "
              "    AND id > $1 AND id <= $2 AND (NOT $4 OR topic = $3) "
              "    ORDER BY id LIMIT $5 FOR UPDATE) "
              "UPDATE " +
              t +
              " AS e SET processed_at = NULL, sinks_done = '{}', attempts = 0, "
              "  next_attempt_at = '-infinity', dead_lettered_at = NULL, lease_owner = NULL, lease_until = NULL "
              "FROM picked WHERE e.id = picked.id RETURNING e.id",
          cursor, last, topic.value_or(""), topic.has_value(), static_cast<long long>(kAdminBatch));
      if (!rows.empty()) tx.exec_params("SELECT pg_notify($1, '')", channel);
      return rows;
    });
  } catch (const std::exception& e) {
    fail("replay", e, url, table);
  }
}

struct BacklogProbe::Impl {
  std::string url;
  std::string table;
  std::string sql;
  std::unique_ptr<pqxx::connection> conn;
};

BacklogProbe::BacklogProbe(std::string url, const std::string& table) : impl_(std::make_unique<Impl>()) {
  impl_->url = std::move(url);
  impl_->table = table;
  // Count over the pending partial index; the oldest pending row is the lowest pending id
  // (ids and created_at both come from the insert, and writers cannot set created_at), which
  // the same index finds without a scan.
  impl_->sql = R"sql(
SELECT (SELECT count(*) FROM {table} WHERE processed_at IS NULL AND dead_lettered_at IS NULL),
       coalesce((SELECT greatest(extract(epoch FROM now() - created_at), 0)::float8 FROM {table}
                  WHERE processed_at IS NULL AND dead_lettered_at IS NULL ORDER BY id LIMIT 1), 0),
       pg_notification_queue_usage()::float8
)sql";
}

BacklogProbe::~BacklogProbe() = default;

BacklogProbe::Reading BacklogProbe::read() {
  auto& im = *impl_;
  try {
    background_session(im.conn, im.url, "metrics");
    pqxx::nontransaction tx(*im.conn);
    const auto row = tx.exec1(with_table(im.sql, im.url, im.table));
    return {row[0].as<long long>(), row[1].as<double>(), row[2].as<double>()};
  } catch (const std::exception& e) {
    im.conn.reset();
    fail_quietly("backlog query", e, im.url, im.table);
  }
}

struct RetentionSweeper::Impl {
  std::string url;
  std::string table;
  std::string sql;
  std::string due_sql;
  std::size_t batch = kRetentionBatch;
  std::string resume = "-infinity";  // the newest processed_at the pass deleted so far
  std::unique_ptr<pqxx::connection> conn;

  pqxx::connection& session() {
    if (!conn) {
      background_session(conn, url, "retention");
      pqxx::nontransaction tx(*conn);
      tx.exec0("SET synchronous_commit = off");
    }
    return *conn;
  }
};

RetentionSweeper::RetentionSweeper(std::string url, const std::string& table, std::size_t batch)
    : impl_(std::make_unique<Impl>()) {
  impl_->url = std::move(url);
  impl_->table = table;
  impl_->batch = batch;
  // The inner SELECT walks the processed_at index from the previous batch's newest row (>=: rows
  // marked by one statement share a processed_at); SKIP LOCKED passes over rows an operator
  // command holds (the next pass, which starts from the oldest, takes them). dead_lettered_at IS
  // NULL is implied (dead letters are never processed) and stated anyway: retention must never
  // delete a dead letter.
  impl_->sql = R"sql(
WITH d AS (
  DELETE FROM {table}
   WHERE id = ANY(ARRAY(
           SELECT id FROM {table}
            WHERE processed_at < now() - $1 * interval '1 millisecond'
              AND processed_at >= $3::timestamptz AND dead_lettered_at IS NULL
            ORDER BY processed_at LIMIT $2 FOR UPDATE SKIP LOCKED))
  RETURNING processed_at)
SELECT count(*), max(processed_at)::text FROM d
)sql";
  impl_->due_sql = R"sql(
SELECT greatest(0, ceil(1000 * extract(epoch FROM processed_at + $1 * interval '1 millisecond' - now())))::bigint
  FROM {table} WHERE processed_at IS NOT NULL AND dead_lettered_at IS NULL
 ORDER BY processed_at LIMIT 1
)sql";
}

RetentionSweeper::~RetentionSweeper() = default;

std::size_t RetentionSweeper::batch_size() const { return impl_->batch; }

void RetentionSweeper::begin_pass() { impl_->resume = "-infinity"; }

std::size_t RetentionSweeper::delete_batch(std::chrono::milliseconds older_than) {
  auto& im = *impl_;
  try {
    pqxx::work tx(im.session());
    const auto row = tx.exec_params1(with_table(im.sql, im.url, im.table), static_cast<long long>(older_than.count()),
                                     static_cast<long long>(im.batch), im.resume);
    tx.commit();
    if (!row[1].is_null()) im.resume = row[1].as<std::string>();
    return row[0].as<std::size_t>();
  } catch (const std::exception& e) {
    im.conn.reset();
    fail_quietly("retention", e, im.url, im.table);
  }
}

std::optional<std::chrono::milliseconds> RetentionSweeper::next_due(std::chrono::milliseconds older_than) {
  auto& im = *impl_;
  try {
    pqxx::nontransaction tx(im.session());
    const auto rows =
        tx.exec_params(with_table(im.due_sql, im.url, im.table), static_cast<long long>(older_than.count()));
    if (rows.empty()) return std::nullopt;
    return std::chrono::milliseconds{rows[0][0].as<long long>()};
  } catch (const std::exception& e) {
    im.conn.reset();
    fail_quietly("retention", e, im.url, im.table);
  }
}

}  // namespace outbox::pg
