#include "postgres/conninfo.hpp"

#include <libpq-fe.h>

#include <memory>
#include <string_view>

namespace outbox::pg {

std::string url_database(const std::string& url) {
  std::string database;
  char* error = nullptr;
  std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)> options(PQconninfoParse(url.c_str(), &error),
                                                                       &PQconninfoFree);
  if (error) PQfreemem(error);
  std::string user;
  for (auto* o = options.get(); o && o->keyword; ++o) {
    if (!o->val) continue;
    if (std::string_view(o->keyword) == "dbname") database = o->val;
    if (std::string_view(o->keyword) == "user") user = o->val;
  }
  return database.empty() ? user : database;  // libpq's own default
}

}  // namespace outbox::pg
