// SQLSTATE and connection-failure classification: tables of real codes and messages.
#include <doctest/doctest.h>

#include <string>
#include <utility>
#include <vector>

#include "postgres/sqlstate.hpp"

using namespace outbox;
using outbox::pg::classify_connection_failure;
using outbox::pg::classify_sqlstate;
using outbox::pg::operator_hint;
using outbox::pg::row_tied_sqlstate;

TEST_CASE("classify_sqlstate: transient, needs an operator, or other") {
  const std::vector<std::pair<std::string, DbErrorClass>> table{
      // connection exception (08), resources (53), operator intervention (57), serialization (40)
      {"08000", DbErrorClass::kTransient},
      {"08003", DbErrorClass::kTransient},
      {"08006", DbErrorClass::kTransient},
      {"08001", DbErrorClass::kTransient},
      {"08P01", DbErrorClass::kTransient},
      {"53000", DbErrorClass::kTransient},
      {"53100", DbErrorClass::kTransient},
      {"53200", DbErrorClass::kTransient},
      {"53300", DbErrorClass::kTransient},
      {"57014", DbErrorClass::kTransient},
      {"57P01", DbErrorClass::kTransient},
      {"57P02", DbErrorClass::kTransient},
      {"57P03", DbErrorClass::kTransient},
      {"40001", DbErrorClass::kTransient},
      {"40P01", DbErrorClass::kTransient},
      {"40000", DbErrorClass::kTransient},
      {"55P03", DbErrorClass::kTransient},
      {"55006", DbErrorClass::kTransient},
      // privilege
      {"42501", DbErrorClass::kPrivilege},
      // undefined object: not migrated, or an older schema
      {"42P01", DbErrorClass::kUndefinedObject},
      {"42883", DbErrorClass::kUndefinedObject},
      {"42703", DbErrorClass::kUndefinedObject},
      {"42704", DbErrorClass::kUndefinedObject},
      {"3F000", DbErrorClass::kUndefinedObject},
      // authentication
      {"28P01", DbErrorClass::kAuthentication},
      {"28000", DbErrorClass::kAuthentication},
      // configuration: the database itself
      {"3D000", DbErrorClass::kConfiguration},
      {"57P04", DbErrorClass::kConfiguration},
      // anything not listed: other (retried like a transient error)
      {"42601", DbErrorClass::kOther},  // syntax error: a bug, not the operator's
      {"23505", DbErrorClass::kOther},
      {"25006", DbErrorClass::kOther},
      {"XX000", DbErrorClass::kOther},
      {"0A000", DbErrorClass::kOther},
      {"", DbErrorClass::kOther},
      {"08", DbErrorClass::kOther},  // not a code
  };
  for (const auto& [code, expected] : table) {
    CAPTURE(code);
    CHECK(classify_sqlstate(code) == expected);
  }
}

TEST_CASE("classify_connection_failure: libpq's messages for a refused login") {
  const std::vector<std::pair<std::string, DbErrorClass>> table{
      {"connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  password authentication failed for user "
       "\"relay\"\n",
       DbErrorClass::kAuthentication},
      {"connection to server at \"127.0.0.1\", port 5432 failed: fe_sendauth: no password supplied\n",
       DbErrorClass::kAuthentication},
      {"FATAL:  no pg_hba.conf entry for host \"10.0.0.7\", user \"relay\", database \"app\", no encryption\n",
       DbErrorClass::kAuthentication},
      {"FATAL:  role \"relay\" is not permitted to log in\n", DbErrorClass::kAuthentication},
      {"FATAL:  role \"relay\" does not exist\n", DbErrorClass::kAuthentication},
      {"FATAL:  Ident authentication failed for user \"relay\"\n", DbErrorClass::kAuthentication},
      {"FATAL:  database \"appp\" does not exist\n", DbErrorClass::kConfiguration},
      {"FATAL:  permission denied for database \"app\"\nDETAIL:  User does not have CONNECT privilege.\n",
       DbErrorClass::kPrivilege},
      // a reconnect cures these
      {"connection to server at \"127.0.0.1\", port 5999 failed: Connection refused\n\tIs the server running on that "
       "host and accepting TCP/IP connections?\n",
       DbErrorClass::kTransient},
      {"FATAL:  the database system is starting up\n", DbErrorClass::kTransient},
      {"FATAL:  sorry, too many clients already\n", DbErrorClass::kTransient},
      {"server closed the connection unexpectedly\n\tThis probably means the server terminated abnormally\n",
       DbErrorClass::kTransient},
      {"Lost connection to the database server.", DbErrorClass::kTransient},
      {"FATAL:  la authentification par mot de passe a échoué pour l'utilisateur « relay »\n",
       DbErrorClass::kTransient},  // another lc_messages: not recognised, retried
      {"", DbErrorClass::kTransient},
  };
  for (const auto& [message, expected] : table) {
    CAPTURE(message);
    CHECK(classify_connection_failure(message) == expected);
  }
}

TEST_CASE("operator_hint names the fix for each class that needs an operator, nothing otherwise") {
  CHECK(operator_hint(DbErrorClass::kTransient, "relay", "outbox_events").empty());
  CHECK(operator_hint(DbErrorClass::kOther, "relay", "outbox_events").empty());
  CHECK(operator_hint(DbErrorClass::kPrivilege, "relay", "app.outbox_events").find("GRANT outbox_relay TO relay") !=
        std::string::npos);
  CHECK(operator_hint(DbErrorClass::kPrivilege, "", "outbox_events").find("GRANT outbox_relay TO <the login role") !=
        std::string::npos);
  CHECK(operator_hint(DbErrorClass::kUndefinedObject, "relay", "outbox_events").find("outbox-relay migrate") !=
        std::string::npos);
  CHECK(operator_hint(DbErrorClass::kAuthentication, "relay", "outbox_events").find("check the password") !=
        std::string::npos);
  CHECK(operator_hint(DbErrorClass::kConfiguration, "relay", "outbox_events").find("check database.url") !=
        std::string::npos);
}

TEST_CASE("every class has its label, and exactly four need an operator") {
  std::vector<std::string> labels;
  int needing = 0;
  for (auto kind : kAllDbErrorClasses) {
    labels.emplace_back(db_error_label(kind));
    needing += needs_operator(kind) ? 1 : 0;
  }
  CHECK(labels == std::vector<std::string>{"transient", "other", "privilege", "undefined_object", "authentication",
                                           "configuration"});
  CHECK(needing == 4);
}

TEST_CASE("row_tied_sqlstate: the listed codes of an error one event's row can cause, nothing else") {
  for (const char* code : {"54000", "22P05", "22021", "22001", "23514", "23502"}) {
    CAPTURE(code);
    CHECK(row_tied_sqlstate(code));
  }
  // A lost session, a cancel, a deadlock, a missing function, a privilege, an unknown code: the
  // whole statement is retried as before, and no event is dead-lettered for it.
  for (const char* code : {"08006", "57014", "40P01", "42883", "42501", "54001", "22", "", "XX000"}) {
    CAPTURE(code);
    CHECK_FALSE(row_tied_sqlstate(code));
  }
}
