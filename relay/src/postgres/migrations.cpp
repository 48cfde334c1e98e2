#include "postgres/migrations.hpp"

#include <chrono>
#include <random>
#include <stdexcept>
#include <thread>

#include "postgres/admin.hpp"
#include "postgres/pg_store.hpp"
#include "postgres/session.hpp"

namespace outbox::pg {
namespace {

// As admin_failure, except that migrate's own privileges are not the relay's: it creates the
// table, its functions and the roles.
DbError migrate_failure(const std::exception& e, const std::string& url, const std::string& table) {
  if (classify_error(e) != DbErrorClass::kPrivilege) return admin_failure("migrate", e, url, table);
  const std::string hint =
      "migrate creates the table, its functions and the roles outbox_writer and outbox_relay: run it as the table's "
      "owner or a role with CREATE on the schema and CREATEROLE (not as the relay's own role)";
  return DbError("migrate failed: " + describe_error(e) + "; hint: " + hint, DbErrorClass::kPrivilege, hint);
}

// Keeps the WARNINGs a migration raises (e.g. schema 9 when it cannot change the lane's type), for
// migrate to print; other notices are dropped, as before.
class WarningCollector : public pqxx::errorhandler {
 public:
  WarningCollector(pqxx::connection_base& conn, std::vector<std::string>& out) : pqxx::errorhandler(conn), out_(out) {}
  bool operator()(const char msg[]) noexcept override {
    try {
      std::string text(msg);
      if (text.starts_with("WARNING:")) {
        while (!text.empty() && text.back() == '\n') text.pop_back();
        out_.push_back(std::move(text));
      }
    } catch (...) {  // NOLINT(bugprone-empty-catch): a notice lost is better than a throw from here
    }
    return true;
  }

 private:
  std::vector<std::string>& out_;
};

}  // namespace

std::string render_migration(const std::string& sql, const std::string& table, const std::string& channel) {
  std::string out = sql;
  replace_all(out, "{{table}}", table);
  replace_all(out, "{{name}}", table_name_only(table));
  replace_all(out, "{{prefix}}", function_prefix(table));
  replace_all(out, "{{channel}}", channel);
  replace_all(out, "{{fence_tag}}", std::to_string(fence_tag(table)));
  const WriterMarkKeys marks = writer_mark_keys(table);
  replace_all(out, "{{mark_ns}}", std::to_string(marks.lanes));
  replace_all(out, "{{statement_ns}}", std::to_string(marks.statements));
  return out;
}

MigrateResult migrate(const std::string& url, const std::string& table, const std::string& channel, int to_version) {
  for (int attempt = 1;; ++attempt) {
    try {
      auto conn = open_session(url, "migrate", false);  // its files name objects unqualified
      MigrateResult result;
      WarningCollector warnings(*conn, result.warnings);
      pqxx::work tx(*conn);
      tx.exec_params("SELECT pg_advisory_xact_lock($1)", advisory_key("outbox-relay:migrate"));
      // A DDL step waiting for a table lock (behind an open writer) queues every new writer
      // behind it: give up soon, let them through, and try the whole transaction again (55P03).
      tx.exec0("SET LOCAL lock_timeout = '" + std::to_string(kMigrateLockTimeout.count()) + "ms'");
      tx.exec0(
          "CREATE TABLE IF NOT EXISTS outbox_schema_migrations ("
          "  table_name text NOT NULL, version integer NOT NULL, name text NOT NULL,"
          "  applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (table_name, version))");
      const auto done =
          tx.exec_params("SELECT coalesce(max(version), 0) FROM outbox_schema_migrations WHERE table_name = $1", table);
      result.current_version = done[0][0].as<int>();
      // The functions the migrations would make (or replace) serve another table: nothing is done.
      if (auto other = functions_of_another_table(tx, function_prefix(table) + "_claim" + kClaimFunctionArgs, table)) {
        throw std::runtime_error("migrate refused: " + *other);
      }
      for (const auto& m : embedded_migrations()) {
        if (m.version <= result.current_version) continue;
        if (to_version > 0 && m.version > to_version) break;
        tx.exec(render_migration(m.sql, table, channel));
        tx.exec_params("INSERT INTO outbox_schema_migrations (table_name, version, name) VALUES ($1, $2, $3)", table,
                       m.version, std::string(m.name));
        result.applied.emplace_back(m.name);
        result.current_version = m.version;
      }
      tx.commit();
      return result;
    } catch (const pqxx::sql_error& e) {
      if (e.sqlstate() != "55P03") throw migrate_failure(e, url, table);
      if (attempt >= kMigrateLockTries) {
        throw std::runtime_error("migrate failed: the table stayed locked by other transactions through " +
                                 std::to_string(kMigrateLockTries) +
                                 " tries; look for long-running transactions on it (pg_stat_activity) and "
                                 "run migrate again: " +
                                 describe_error(e));
      }
      // Writers go on meanwhile; a little jitter so that two migrate runs do not keep colliding.
      static thread_local std::mt19937 rng{std::random_device{}()};
      std::this_thread::sleep_for(kMigrateRetryPause +
                                  std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 99)(rng)));
    } catch (const std::exception& e) {
      throw migrate_failure(e, url, table);
    }
  }
}

}  // namespace outbox::pg
