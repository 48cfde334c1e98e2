#include "postgres/session.hpp"

#include <libpq-fe.h>

#include <cstdlib>
#include <string>

#include "postgres/sqlstate.hpp"

namespace outbox::pg {

void replace_all(std::string& text, const std::string& from, const std::string& to) {
  for (std::size_t pos = text.find(from); pos != std::string::npos; pos = text.find(from, pos + to.size())) {
    text.replace(pos, from.size(), to);
  }
}

std::unique_ptr<pqxx::connection> open_session(const std::string& url, const std::string& role) {
  auto conn = std::make_unique<pqxx::connection>(url);
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wdeprecated-declarations"
  conn->inhibit_reactivation(true);
#pragma GCC diagnostic pop
  pqxx::nontransaction tx(*conn);
  tx.exec0("SET application_name = " + tx.quote("outbox-relay " + role));
  tx.commit();
  return conn;
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
