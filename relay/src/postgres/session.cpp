#include "postgres/session.hpp"

#include <string>

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
