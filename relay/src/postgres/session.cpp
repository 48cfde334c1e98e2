#include "postgres/session.hpp"

#include <libpq-fe.h>

#include <cstdlib>
#include <string>

#include "postgres/sqlstate.hpp"

namespace outbox::pg {

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

std::string describe_error(const std::exception& e) {
  std::string text = e.what();
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e); sql && !sql->sqlstate().empty()) {
    text = "SQLSTATE " + sql->sqlstate() + ": " + text;
  }
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  return log::redact(text);
}

DbErrorClass classify_error(const std::exception& e) {
  if (const auto* db = dynamic_cast<const DbError*>(&e)) return db->kind();
  if (const auto* sql = dynamic_cast<const pqxx::sql_error*>(&e); sql && !sql->sqlstate().empty()) {
    return classify_sqlstate(sql->sqlstate());
  }
  // Refused logins and lost sessions alike: libpqxx 6.4 has no SQLSTATE for either.
  if (dynamic_cast<const pqxx::broken_connection*>(&e)) return classify_connection_failure(e.what());
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
