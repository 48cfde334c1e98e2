#pragma once
// What kind of database failure a session ran into, as the runner, the LISTEN thread, /readyz and
// the metrics see it. The Postgres side (postgres/sqlstate.hpp) maps SQLSTATEs and connection
// failures onto these classes; the core only decides how to wait and what to tell the operator.
#include <stdexcept>
#include <string>

namespace outbox {

// A bounded set: each value is a label of outbox_relay_db_errors_total{class} and a word in the
// /readyz reasons (docs/operations.md "Database errors").
enum class DbErrorClass {
  kTransient,        // connection lost or refused, resources, operator intervention, serialization
  kOther,            // a code no rule lists: retried like a transient error, but shown apart
  kPrivilege,        // the login role lacks the relay's grants (42501)
  kUndefinedObject,  // the table, a column or a function is missing: not migrated (42P01, 42883, ...)
  kAuthentication,   // the server refused the login (28P01 wrong password, 28000)
  kConfiguration,    // the database itself is wrong (3D000: it does not exist)
};

inline constexpr DbErrorClass kAllDbErrorClasses[] = {
    DbErrorClass::kTransient,       DbErrorClass::kOther,          DbErrorClass::kPrivilege,
    DbErrorClass::kUndefinedObject, DbErrorClass::kAuthentication, DbErrorClass::kConfiguration,
};

// transient | other | privilege | undefined_object | authentication | configuration
const char* db_error_label(DbErrorClass kind);

// True for the classes that a reconnect cannot cure: an operator has to act (grant, migrate, fix
// the password or the URL). Sessions then retry at the backoff cap and log at error with a hint.
bool needs_operator(DbErrorClass kind);

// A failed database operation: the message (password masked), its class, and for the classes
// that need an operator, a hint naming the fix.
class DbError : public std::runtime_error {
 public:
  explicit DbError(const std::string& what, DbErrorClass kind = DbErrorClass::kTransient, std::string hint = {})
      : std::runtime_error(what), kind_(kind), hint_(std::move(hint)) {}
  DbErrorClass kind() const { return kind_; }
  const std::string& hint() const { return hint_; }

 private:
  DbErrorClass kind_;
  std::string hint_;
};

}  // namespace outbox
