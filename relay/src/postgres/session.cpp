#include "postgres/session.hpp"

#include <libpq-fe.h>

#include <cstdlib>
#include <map>
#include <mutex>
#include <string>
#include <utility>

#include "postgres/conninfo.hpp"
#include "postgres/pg_store.hpp"
#include "postgres/sqlstate.hpp"

namespace outbox::pg {

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  for (std::size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, pos + to.size())) {
    text.replace(pos, from.size(), to);
  }
}

// What a statement of the relay means must not depend on settings its role or database carries
// (ALTER ROLE ... SET, ALTER DATABASE ... SET, PGOPTIONS): names resolve in pg_catalog only; text
// comes as UTF-8 whatever client_encoding was set (LATIN1 turned "€" into "?" or failed the whole
// claim); row-level security is an error, never a filter that hides events while every health
// signal stays green; each statement sees what committed before it (serializable or read-only
// defaults broke the claim's reading); no session is ended for being idle or for one error.
constexpr const char* kPinnedSettings =
    "SET search_path = pg_catalog, pg_temp; SET client_encoding = 'UTF8'; SET row_security = off; "
    "SET default_transaction_isolation = 'read committed'; SET default_transaction_read_only = off; "
    "SET standard_conforming_strings = on; SET transform_null_equals = off; SET DateStyle = 'ISO, YMD'; "
    "SET IntervalStyle = 'postgres'; SET TimeZone = 'UTC'; SET extra_float_digits = 1; "
    "SET exit_on_error = off; SET idle_in_transaction_session_timeout = 0; "
    // PostgreSQL 14 and later.
    "SELECT pg_catalog.set_config(s.name, '0', false) FROM pg_catalog.pg_settings AS s "
    "WHERE s.name = 'idle_session_timeout'";

std::unique_ptr<pqxx::connection> open_session(const std::string& url, const std::string& role, bool pinned) {
  auto conn = std::make_unique<pqxx::connection>(with_session_defaults(url));
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  conn->inhibit_reactivation(true);
#pragma GCC diagnostic pop
  pqxx::nontransaction tx(*conn);
  tx.exec0("SET application_name = " + tx.quote("outbox-relay " + role));
  if (pinned) tx.exec(kPinnedSettings);
  tx.commit();
  return conn;
}

namespace {

// The schemas of the session's search_path holding a table (or partitioned table) of that name,
// in path order; a qualified name: its schema if it holds one.
constexpr const char* kFindTable = R"sql(
SELECT n.nspname, c.oid::pg_catalog.int8
  FROM pg_catalog.unnest(CASE WHEN $1 = '' THEN pg_catalog.current_schemas(false) ELSE ARRAY[$1]::pg_catalog.name[] END)
       WITH ORDINALITY AS s(nsp, pos)
  JOIN pg_catalog.pg_namespace AS n ON n.nspname = s.nsp
  JOIN pg_catalog.pg_class AS c ON c.relnamespace = n.oid AND c.relname = $2 AND c.relkind IN ('r', 'p')
 ORDER BY s.pos
)sql";

// The schema of the table's functions (its claim function, owned by the table's owner): the
// table's own first, then the path's order; and the schema of the migrations' table likewise.
constexpr const char* kFindObjects = R"sql(
SELECT (SELECT n.nspname
          FROM pg_catalog.pg_proc AS p
          JOIN pg_catalog.pg_namespace AS n ON n.oid = p.pronamespace
         WHERE p.proname = $2 AND p.proowner = t.relowner
         ORDER BY n.oid = t.relnamespace DESC,
                  pg_catalog.array_position(pg_catalog.current_schemas(false), n.nspname) NULLS LAST
         LIMIT 1),
       (SELECT n.nspname
          FROM pg_catalog.pg_class AS m
          JOIN pg_catalog.pg_namespace AS n ON n.oid = m.relnamespace
         WHERE m.relname = 'outbox_schema_migrations' AND m.relkind = 'r' AND m.relowner = t.relowner
         ORDER BY n.oid = t.relnamespace DESC,
                  pg_catalog.array_position(pg_catalog.current_schemas(false), n.nspname) NULLS LAST
         LIMIT 1)
  FROM pg_catalog.pg_class AS t WHERE t.oid = $1::pg_catalog.oid
)sql";

// $1 the function (regprocedure text), $2 the table as configured. The table's qualified name as
// the function's body names it (schema 10 writes format('%I.%I')), whether the body names it as a
// whole identifier, and else the first table of that name the body does name.
constexpr const char* kFunctionServes = R"sql(
WITH t AS (
  SELECT coalesce((SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
                     FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
                    WHERE c.oid = pg_catalog.to_regclass($2)),
                  (SELECT CASE WHEN pg_catalog.cardinality(i) = 1
                               THEN pg_catalog.format('%I.%I', pg_catalog.current_schema(), i[1])
                               ELSE pg_catalog.format('%I.%I', i[1], i[2]) END
                     FROM pg_catalog.parse_ident($2) AS i)) AS q),
f AS (
  SELECT p.oid::pg_catalog.regprocedure::text AS fn, pg_catalog.pg_get_functiondef(p.oid) AS def
    FROM pg_catalog.pg_proc AS p WHERE p.oid = pg_catalog.to_regprocedure($1))
SELECT f.fn, t.q,
       (SELECT pg_catalog.format('%I.%I', n.nspname, c.relname)
          FROM pg_catalog.pg_class AS c JOIN pg_catalog.pg_namespace AS n ON n.oid = c.relnamespace
         WHERE c.relkind IN ('r', 'p') AND c.relname = (pg_catalog.parse_ident(t.q))[2]
           AND pg_catalog.strpos(f.def, pg_catalog.format('%I.%I', n.nspname, c.relname) || ' ') > 0
         ORDER BY n.nspname LIMIT 1)
  FROM f, t
 WHERE pg_catalog.strpos(f.def, t.q || ' ') = 0
)sql";

std::mutex names_mutex;
std::map<std::pair<std::string, std::string>, TableNames> names_cache;

}  // namespace

TableNames table_names(const std::string& url, const std::string& table) {
  {
    std::lock_guard lock(names_mutex);
    if (auto it = names_cache.find({url, table}); it != names_cache.end()) return it->second;
  }
  const auto dot = table.find('.');
  const std::string schema = dot == std::string::npos ? "" : table.substr(0, dot);
  const std::string name = table_name_only(table);
  auto conn = open_session(url, "resolve", false);
  pqxx::nontransaction q(*conn);
  TableNames out;
  const auto found = q.exec_params(kFindTable, schema, name);
  if (found.empty()) {
    out.table = table;  // not there (not migrated yet): statements fail with 42P01, and say so
    out.functions = function_prefix(table);
    out.migrations = "outbox_schema_migrations";
    if (!schema.empty()) {
      out.schema = schema;
    } else if (const auto current = q.exec1("SELECT pg_catalog.current_schema()"); !current[0].is_null()) {
      out.schema = current[0].as<std::string>();
    }
    return out;
  }
  if (found.size() > 1) {
    std::string where;
    for (const auto& row : found) where += (where.empty() ? "" : ", ") + row[0].as<std::string>();
    throw AmbiguousTable("database.table '" + table + "' names a table in each of the schemas " + where +
                         " of the search_path of role " + q.quote(url_user(url)) +
                         ": set database.table to the outbox's schema-qualified name (for example " +
                         found[0][0].as<std::string>() + "." + name +
                         "); a table in a schema a writer may create in can shadow the outbox");
  }
  const std::string nsp = found[0][0].as<std::string>();
  const auto objects = q.exec_params1(kFindObjects, found[0][1].as<long long>(), function_prefix(table) + "_claim");
  out.found = true;
  out.schema = nsp;
  out.lock_key = lock_key(nsp, name);
  out.table = q.quote_name(nsp) + "." + q.quote_name(name);
  out.function_schema = objects[0].is_null() ? nsp : objects[0].as<std::string>();
  out.functions = q.quote_name(out.function_schema) + "." + function_prefix(table);
  out.migrations = (objects[1].is_null() ? q.quote_name(nsp) : q.quote_name(objects[1].as<std::string>())) +
                   ".outbox_schema_migrations";
  std::lock_guard lock(names_mutex);
  names_cache.emplace(std::make_pair(url, table), out);
  return out;
}

std::optional<std::string> functions_of_another_table(pqxx::transaction_base& tx, const std::string& function,
                                                      const std::string& table) {
  const auto r = tx.exec_params(kFunctionServes, function, table);
  if (r.empty()) return std::nullopt;
  const std::string fn = r[0][0].as<std::string>(), ours = r[0][1].as<std::string>();
  const std::string theirs = r[0][2].is_null() ? std::string("another table") : "table " + r[0][2].as<std::string>();
  return "the function " + fn + " serves " + theirs + ", not " + ours +
         ": two outbox tables of one name in two schemas share their functions (made by a release before "
         "this one in one schema), and one's relay would mark the other's events processed. Give " +
         ours +
         " functions of its own in its schema: docs/operations.md, \"Two tables sharing their functions\", "
         "says how";
}

std::string sqlstate_of(const std::exception& e) {
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e); sql && !sql->sqlstate().empty()) {
    return sql->sqlstate();
  }
  // libpqxx 6.4 throws its typed exceptions without the code (and its transaction_rollback family
  // is no sql_error at all): the type names the code. Most derived types first.
  if (dynamic_cast<const pqxx::insufficient_privilege*>(&e)) return "42501";
  if (dynamic_cast<const pqxx::undefined_table*>(&e)) return "42P01";
  if (dynamic_cast<const pqxx::undefined_column*>(&e)) return "42703";
  if (dynamic_cast<const pqxx::undefined_function*>(&e)) return "42883";
  if (dynamic_cast<const pqxx::syntax_error*>(&e)) return "42601";
  if (dynamic_cast<const pqxx::feature_not_supported*>(&e)) return "0A000";
  if (dynamic_cast<const pqxx::too_many_connections*>(&e)) return "53300";
  if (dynamic_cast<const pqxx::disk_full*>(&e)) return "53100";
  if (dynamic_cast<const pqxx::out_of_memory*>(&e)) return "53200";
  if (dynamic_cast<const pqxx::insufficient_resources*>(&e)) return "53000";
  if (dynamic_cast<const pqxx::serialization_failure*>(&e)) return "40001";
  if (dynamic_cast<const pqxx::deadlock_detected*>(&e)) return "40P01";
  if (dynamic_cast<const pqxx::statement_completion_unknown*>(&e)) return "40003";
  if (dynamic_cast<const pqxx::transaction_rollback*>(&e)) return "40000";
  return {};
}

std::string describe_error(const std::exception& e) {
  std::string text = e.what();
  if (const std::string code = sqlstate_of(e); !code.empty()) text = "SQLSTATE " + code + ": " + text;
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return log::redact(text);
}

DbErrorClass classify_error(const std::exception& e) {
  if (const auto* db = dynamic_cast<const DbError*>(&e)) return db->kind();
  if (const std::string code = sqlstate_of(e); !code.empty()) return classify_sqlstate(code);
  // Refused logins and lost sessions alike: libpqxx 6.4 has no SQLSTATE for either.
  if (dynamic_cast<const pqxx::broken_connection*>(&e)) return classify_connection_failure(e.what());
  // The outcome of a commit is unknown because the session was lost.
  if (dynamic_cast<const pqxx::in_doubt_error*>(&e)) return DbErrorClass::kTransient;
  return DbErrorClass::kOther;
}

StoreUnavailable store_failure(const char* what, const std::exception& e, const HintContext& hints) {
  const DbErrorClass kind = classify_error(e);
  return StoreUnavailable(std::string(what) + ": " + describe_error(e), kind,
                          operator_hint(kind, hints.user, hints.table));
}

std::string url_user(const std::string& url) {
  std::string user;
  char* error = nullptr;
  if (PQconninfoOption* options = PQconninfoParse(url.c_str(), &error)) {
    for (const PQconninfoOption* o = options; o->keyword != nullptr; ++o) {
      if (std::string_view(o->keyword) == "user" && o->val != nullptr) user = o->val;
    }
    PQconninfoFree(options);
  }
  if (error != nullptr) PQfreemem(error);
  if (user.empty()) {
    if (const char* env = std::getenv("PGUSER")) user = env;
  }
  return user;
}

std::string lock_key(const std::string& schema, const std::string& name) {
  return schema == "public" ? name : schema + "." + name;
}

std::string quote_identifier(const std::string& name) {
  std::string out = "\"";
  for (const char c : name) {
    out += c;
    if (c == '"') out += '"';
  }
  return out + "\"";
}

std::string table_name_only(const std::string& table) {
  const auto dot = table.find('.');
  return dot == std::string::npos ? table : table.substr(dot + 1);
}

std::string function_prefix(const std::string& table) {
  std::string prefix = table_name_only(table);
  const std::string suffix = "_events";
  if (prefix.size() > suffix.size() && prefix.ends_with(suffix)) prefix.resize(prefix.size() - suffix.size());
  return prefix;
}

}  // namespace outbox::pg
