#include "postgres/migrations.hpp"

#include <chrono>
#include <cstdio>
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

namespace {

// "schema"."name": the table as the rendered files and migrate's own statements name it.
std::string qualified_table(const MigrationTarget& target) {
  return quote_identifier(target.schema) + "." + quote_identifier(target.name);
}

// Builds one index with CREATE INDEX CONCURRENTLY: writers go on (the plain CREATE INDEX of a
// migration's transaction holds a SHARE lock on the table, which stops every writer for the whole
// scan of a table that may hold millions of rows). The build waits for the transactions open at
// its start, not the other way round. An index that exists and is valid is left alone; one that
// another session is building is waited for; one left invalid by a build that failed is dropped
// and built again. A build that fails is dropped and said (a warning): the migration's own
// CREATE INDEX IF NOT EXISTS then builds it in its transaction.
void build_concurrently(pqxx::nontransaction& tx, const MigrationTarget& target, const IndexStatement& index,
                        std::vector<std::string>& warnings) {
  const std::string qualified = quote_identifier(target.schema) + "." + index.name;
  for (int builds = 0;;) {
    const auto r = tx.exec_params(
        "SELECT i.indisvalid AND i.indisready, EXISTS (SELECT 1 FROM pg_catalog.pg_stat_progress_create_index AS p "
        "                                              WHERE p.index_relid = i.indexrelid) "
        "FROM pg_catalog.pg_index AS i WHERE i.indexrelid = pg_catalog.to_regclass($1)",
        qualified);
    if (!r.empty() && r[0][0].as<bool>()) return;
    if (!r.empty() && r[0][1].as<bool>()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));  // another migrate's build
      continue;
    }
    if (!r.empty()) tx.exec0("DROP INDEX CONCURRENTLY IF EXISTS " + qualified);  // a failed build's leftover
    if (builds++ == 2) {
      warnings.push_back("WARNING: outbox-relay: the index " + index.name +
                         " was left invalid by two concurrent builds, so migrate builds it in its transaction "
                         "(writers wait for that build)");
      return;
    }
    try {
      // Said first: the build waits for every transaction open on the table when it starts.
      std::printf("building the index %s concurrently (writers go on; it waits for the transactions open on %s)\n",
                  index.name.c_str(), qualified_table(target).c_str());
      std::fflush(stdout);
      tx.exec0("CREATE INDEX CONCURRENTLY IF NOT EXISTS " + index.name + " " + index.definition);
    } catch (const pqxx::sql_error& e) {
      tx.exec0("DROP INDEX CONCURRENTLY IF EXISTS " + qualified);
      warnings.push_back("WARNING: outbox-relay: the index " + index.name +
                         " could not be built concurrently, so migrate builds it in its transaction (writers wait "
                         "for that build): " +
                         describe_error(e));
      return;
    }
  }
}

// The indexes of the pending migrations, built before their transaction (build_concurrently) when
// the table exists already.
std::vector<std::string> build_indexes_first(const std::string& url, const MigrationTarget& target,
                                             const std::string& records, const std::string& table, int to_version,
                                             const std::string& channel) {
  std::vector<std::string> warnings;
  auto conn = open_session(url, "migrate");
  pqxx::nontransaction tx(*conn);
  if (tx.exec_params1("SELECT pg_catalog.to_regclass($1) IS NULL", qualified_table(target))[0].as<bool>()) {
    return warnings;
  }
  int current = 0;  // as migrate reads it (the records of a release before lock_key have no such column)
  if (!tx.exec_params1("SELECT pg_catalog.to_regclass($1) IS NULL", records)[0].as<bool>()) {
    current = tx.exec_params1("SELECT coalesce(max(version), 0) FROM " + records + " WHERE table_name IN ($1, $2, $3)",
                              table, target.schema + "." + target.name, target.lock_key)[0]
                  .as<int>();
  }
  tx.exec0("SET statement_timeout = 0; SET lock_timeout = 0");
  for (const auto& m : embedded_migrations()) {
    if (m.version <= current) continue;
    if (to_version > 0 && m.version > to_version) break;
    for (const auto& index : indexes_created(render_migration(m.sql, target, channel))) {
      build_concurrently(tx, target, index, warnings);
    }
  }
  return warnings;
}

}  // namespace

std::vector<IndexStatement> indexes_created(const std::string& sql) {
  static constexpr std::string_view kCreate = "\nCREATE INDEX IF NOT EXISTS ";
  std::vector<IndexStatement> out;
  const std::string text = "\n" + sql;
  for (auto at = text.find(kCreate); at != std::string::npos; at = text.find(kCreate, at + 1)) {
    const auto name = at + kCreate.size();
    const auto space = text.find(' ', name);
    const auto end = text.find(';', space);
    if (space == std::string::npos || end == std::string::npos) break;
    out.push_back({text.substr(name, space - name), text.substr(space + 1, end - space - 1)});
  }
  return out;
}

std::string render_migration(const std::string& sql, const MigrationTarget& target, const std::string& channel) {
  std::string out = sql;
  const std::string schema = quote_identifier(target.schema);
  replace_all(out, "{{table}}", qualified_table(target));
  replace_all(out, "{{name}}", target.name);
  replace_all(out, "{{fn}}", quote_identifier(target.function_schema) + "." + function_prefix(target.name));
  replace_all(out, "{{prefix}}", function_prefix(target.name));
  replace_all(out, "{{schema}}", schema);
  replace_all(out, "{{function_schema}}", quote_identifier(target.function_schema));
  replace_all(out, "{{channel}}", channel);
  replace_all(out, "{{writer_role}}", target.roles + "_writer");
  replace_all(out, "{{relay_role}}", target.roles + "_relay");
  replace_all(out, "{{fence_tag}}", std::to_string(fence_tag(target.lock_key)));
  const WriterMarkKeys marks = writer_mark_keys(target.lock_key);
  replace_all(out, "{{mark_ns}}", std::to_string(marks.lanes));
  replace_all(out, "{{statement_ns}}", std::to_string(marks.statements));
  return out;
}

MigrateResult migrate(const std::string& url, const std::string& table, const std::string& channel,
                      const std::string& roles, int to_version) {
  for (int attempt = 1;; ++attempt) {
    try {
      // The table's schema, resolved on the role's own path (an unqualified name held by several
      // of its schemas is refused: AmbiguousTable); then a pinned session: every name of the files
      // is qualified, and nothing a writer made in a schema of the path can stand in for a
      // function or operator of pg_catalog.
      const TableNames names = table_names(url, table);
      if (names.schema.empty()) {
        throw std::runtime_error("migrate refused: the role's search_path names no schema that exists to make " +
                                 table + " in: set database.table to a schema-qualified name");
      }
      const std::string name = table_name_only(table);
      MigrationTarget target{names.schema, name, names.found ? names.function_schema : names.schema, roles,
                             lock_key(names.schema, name)};
      const std::string records =
          names.found ? names.migrations : quote_identifier(names.schema) + ".outbox_schema_migrations";
      MigrateResult result;
      result.warnings = build_indexes_first(url, target, records, table, to_version, channel);
      auto conn = open_session(url, "migrate");
      WarningCollector warnings(*conn, result.warnings);
      pqxx::work tx(*conn);
      tx.exec_params("SELECT pg_advisory_xact_lock($1)", advisory_key("outbox-relay:migrate"));
      // A DDL step waiting for a table lock (behind an open writer) queues every new writer
      // behind it: give up soon, let them through, and try the whole transaction again (55P03).
      tx.exec0("SET LOCAL lock_timeout = '" + std::to_string(kMigrateLockTimeout.count()) + "ms'");
      tx.exec0("CREATE TABLE IF NOT EXISTS " + records +
               " ("
               "  table_name text NOT NULL, version integer NOT NULL, name text NOT NULL,"
               "  applied_at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (table_name, version))");
      // The seed of the namespaces the files were rendered with (null: a release before this one
      // seeded them with the table as configured, and its recorded name is that).
      tx.exec0("ALTER TABLE " + records + " ADD COLUMN IF NOT EXISTS lock_key text");
      // Recorded as configured then, or as schema.name, or (in public) as the bare name.
      const auto done = tx.exec_params(
          "SELECT coalesce(max(version), 0), (array_agg(lock_key ORDER BY version DESC))[1], "
          "(array_agg(table_name ORDER BY version DESC))[1] FROM " +
              records + " WHERE table_name IN ($1, $2, $3)",
          table, target.schema + "." + target.name, target.lock_key);
      result.current_version = done[0][0].as<int>();
      if (result.current_version > 0) {
        target.lock_key = done[0][1].is_null() ? done[0][2].as<std::string>() : done[0][1].as<std::string>();
      }
      // The functions the migrations would make (or replace) serve another table: nothing is done
      // (schema 12's claim function, or before it is made, schema 10's, which 12 derives from).
      for (const char* args : {kClaimFunctionArgs, kSchema10ClaimFunctionArgs}) {
        if (auto other = functions_of_another_table(
                tx, quote_identifier(target.function_schema) + "." + function_prefix(table) + "_claim" + args,
                qualified_table(target))) {
          throw std::runtime_error("migrate refused: " + *other);
        }
      }
      for (const auto& m : embedded_migrations()) {
        if (m.version <= result.current_version) continue;
        if (to_version > 0 && m.version > to_version) break;
        tx.exec(render_migration(m.sql, target, channel));
        tx.exec_params("INSERT INTO " + records + " (table_name, version, name, lock_key) VALUES ($1, $2, $3, $4)",
                       table, m.version, std::string(m.name), target.lock_key);
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
