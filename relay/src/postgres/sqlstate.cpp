#include "postgres/sqlstate.hpp"

#include <array>
#include <utility>

namespace outbox::pg {
namespace {

using Rule = std::pair<std::string_view, DbErrorClass>;

// Exact codes first (they override their class below).
constexpr std::array kCodes{
    Rule{"42501", DbErrorClass::kPrivilege},        // insufficient_privilege
    Rule{"42P01", DbErrorClass::kUndefinedObject},  // undefined_table
    Rule{"42883", DbErrorClass::kUndefinedObject},  // undefined_function (an older schema)
    Rule{"42703", DbErrorClass::kUndefinedObject},  // undefined_column (an older schema)
    Rule{"42704", DbErrorClass::kUndefinedObject},  // undefined_object
    Rule{"3F000", DbErrorClass::kUndefinedObject},  // invalid_schema_name (database.table's schema)
    Rule{"28P01", DbErrorClass::kAuthentication},   // invalid_password
    Rule{"28000", DbErrorClass::kAuthentication},   // invalid_authorization_specification
    Rule{"3D000", DbErrorClass::kConfiguration},    // invalid_catalog_name: no such database
    Rule{"57P04", DbErrorClass::kConfiguration},    // database_dropped
    Rule{"40001", DbErrorClass::kTransient},        // serialization_failure
    Rule{"40P01", DbErrorClass::kTransient},        // deadlock_detected
    Rule{"55P03", DbErrorClass::kTransient},        // lock_not_available
    Rule{"55006", DbErrorClass::kTransient},        // object_in_use
};

// Then the two-character class.
constexpr std::array kClasses{
    Rule{"08", DbErrorClass::kTransient},  // connection exception
    Rule{"53", DbErrorClass::kTransient},  // insufficient resources (too many connections, ...)
    Rule{"57", DbErrorClass::kTransient},  // operator intervention (shutdown, cancel, starting up)
    Rule{"40", DbErrorClass::kTransient},  // transaction rollback
    Rule{"28", DbErrorClass::kAuthentication},
};

constexpr std::array<std::string_view, 6> kRowTied{
    "54000",  // program_limit_exceeded: "index row size ... exceeds maximum" (a very long key)
    "22P05",  // untranslatable_character
    "22021",  // character_not_in_repertoire
    "22001",  // string_data_right_truncation
    "23514",  // check_violation (a NOT VALID constraint an old row breaks)
    "23502",  // not_null_violation
};

// Fragments of the server's FATAL messages at connection time (src/backend/libpq/auth.c,
// postinit.c) and of libpq's own (fe-auth.c).
constexpr std::array kConnectionMessages{
    Rule{"password authentication failed", DbErrorClass::kAuthentication},
    Rule{"no password supplied", DbErrorClass::kAuthentication},
    Rule{"no pg_hba.conf entry", DbErrorClass::kAuthentication},
    Rule{"is not permitted to log in", DbErrorClass::kAuthentication},
    Rule{"authentication failed for user", DbErrorClass::kAuthentication},  // ident, peer, ...
    Rule{"does not exist", DbErrorClass::kConfiguration},                   // refined below: role or database
    Rule{"permission denied for database", DbErrorClass::kPrivilege},       // no CONNECT privilege
};

}  // namespace

DbErrorClass classify_sqlstate(std::string_view sqlstate) {
  for (const auto& [code, kind] : kCodes) {
    if (sqlstate == code) return kind;
  }
  if (sqlstate.size() == 5) {
    for (const auto& [prefix, kind] : kClasses) {
      if (sqlstate.starts_with(prefix)) return kind;
    }
  }
  return DbErrorClass::kOther;
}

DbErrorClass classify_connection_failure(std::string_view message) {
  for (const auto& [fragment, kind] : kConnectionMessages) {
    if (message.find(fragment) == std::string_view::npos) continue;
    // FATAL: role "x" does not exist (28000) / FATAL: database "x" does not exist (3D000).
    if (kind == DbErrorClass::kConfiguration && message.find("role \"") != std::string_view::npos) {
      return DbErrorClass::kAuthentication;
    }
    if (kind == DbErrorClass::kConfiguration && message.find("database \"") == std::string_view::npos) continue;
    return kind;
  }
  return DbErrorClass::kTransient;
}

std::string operator_hint(DbErrorClass kind, const std::string& user, const std::string& table) {
  const std::string role = user.empty() ? "<the login role of database.url>" : user;
  switch (kind) {
    case DbErrorClass::kTransient:
    case DbErrorClass::kOther: return {};
    case DbErrorClass::kPrivilege:
      return "the login role lacks the relay's privileges on " + table + ": GRANT outbox_relay TO " + role +
             " (the role outbox_relay comes with `outbox-relay migrate`; a role without CONNECT on the database "
             "also needs GRANT CONNECT ON DATABASE)";
    case DbErrorClass::kUndefinedObject:
      return "the outbox schema for " + table +
             " is missing or older than this relay: run `outbox-relay migrate` "
             "with the same config, or check database.table";
    case DbErrorClass::kAuthentication:
      return "the server refused the login of " + role +
             ": check the password (database.url, PGPASSWORD or the "
             "secret it comes from) and pg_hba.conf";
    case DbErrorClass::kConfiguration:
      return "the database named in database.url does not exist or was dropped: check database.url";
  }
  return {};  // not reached
}

bool row_tied_sqlstate(std::string_view sqlstate) {
  for (const auto code : kRowTied) {
    if (code == sqlstate) return true;
  }
  return false;
}

}  // namespace outbox::pg
