#include "postgres/conninfo.hpp"

#include <libpq-fe.h>

#include <cstdlib>
#include <memory>
#include <string_view>

namespace outbox::pg {

namespace {

using Options = std::unique_ptr<PQconninfoOption, decltype(&PQconninfoFree)>;

// The settings the string itself gives (not the environment's); null when libpq cannot parse it.
Options parse(const std::string& url) {
  char* error = nullptr;
  Options options(PQconninfoParse(url.c_str(), &error), &PQconninfoFree);
  if (error) PQfreemem(error);
  return options;
}

struct Default {
  const char* keyword;
  const char* value;
  const char* env;  // the environment variable libpq reads for it, if any
};
constexpr Default kSessionDefaults[] = {
    {"connect_timeout", "10", "PGCONNECT_TIMEOUT"}, {"keepalives_idle", "10", nullptr},
    {"keepalives_interval", "5", nullptr},          {"keepalives_count", "3", nullptr},
    {"tcp_user_timeout", "30000", nullptr},
};

}  // namespace

std::string with_session_defaults(const std::string& url) {
  const Options options = parse(url);
  if (!options) return url;  // libpq's error at connect names the problem
  const auto given = [&](std::string_view keyword) {
    for (auto* o = options.get(); o->keyword; ++o) {
      if (o->val && keyword == o->keyword) return true;
    }
    return false;
  };
  const std::string_view text(url);
  const bool uri = text.starts_with("postgresql://") || text.starts_with("postgres://");
  std::string out = url;
  for (const Default& d : kSessionDefaults) {
    if (given(d.keyword) || (d.env && std::getenv(d.env))) continue;
    if (uri) {
      out += out.find('?') == std::string::npos ? '?' : '&';
    } else if (!out.empty()) {
      out += ' ';
    }
    out += std::string(d.keyword) + "=" + d.value;
  }
  return out;
}

std::string url_database(const std::string& url) {
  std::string database;
  const Options options = parse(url);
  std::string user;
  for (auto* o = options.get(); o && o->keyword; ++o) {
    if (!o->val) continue;
    if (std::string_view(o->keyword) == "dbname") database = o->val;
    if (std::string_view(o->keyword) == "user") user = o->val;
  }
  return database.empty() ? user : database;  // libpq's own default
}

}  // namespace outbox::pg
