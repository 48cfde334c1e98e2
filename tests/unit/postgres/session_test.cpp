// How libpqxx's exceptions map onto the error classes (no database: the exceptions are built here).
#include <doctest/doctest.h>

#include <cstdlib>

#include "postgres/conninfo.hpp"
#include "postgres/session.hpp"

using namespace outbox;

TEST_CASE("classify_error: a server error by SQLSTATE, a failed login by libpq's message") {
  CHECK(pg::classify_error(pqxx::insufficient_privilege("ERROR:  permission denied for table outbox_events", "SELECT 1",
                                                        "42501")) == DbErrorClass::kPrivilege);
  CHECK(pg::classify_error(pqxx::undefined_table("ERROR:  relation \"outbox_events\" does not exist", "", "42P01")) ==
        DbErrorClass::kUndefinedObject);
  CHECK(pg::classify_error(pqxx::sql_error("ERROR:  deadlock detected", "", "40P01")) == DbErrorClass::kTransient);
  CHECK(pg::classify_error(pqxx::sql_error("no code")) == DbErrorClass::kOther);
  CHECK(pg::classify_error(pqxx::broken_connection(
            "connection to server at \"127.0.0.1\", port 5432 failed: FATAL:  password authentication failed for user "
            "\"relay\"")) == DbErrorClass::kAuthentication);
  CHECK(pg::classify_error(pqxx::broken_connection("server closed the connection unexpectedly")) ==
        DbErrorClass::kTransient);
  CHECK(pg::classify_error(StoreUnavailable("no sequence", DbErrorClass::kUndefinedObject)) ==
        DbErrorClass::kUndefinedObject);
  CHECK(pg::classify_error(std::runtime_error("something else")) == DbErrorClass::kOther);
}

TEST_CASE("classify_error: libpqxx 6.4's typed exceptions carry no code; their type names it") {
  // What libpqxx 6.4 throws for these errors of the server: the type, an empty sqlstate().
  CHECK(pg::sqlstate_of(pqxx::insufficient_privilege("ERROR:  permission denied for table outbox_events")) == "42501");
  CHECK(pg::classify_error(pqxx::insufficient_privilege("ERROR:  permission denied")) == DbErrorClass::kPrivilege);
  CHECK(pg::classify_error(pqxx::undefined_table("ERROR:  relation does not exist")) == DbErrorClass::kUndefinedObject);
  CHECK(pg::classify_error(pqxx::undefined_column("ERROR:  column does not exist")) == DbErrorClass::kUndefinedObject);
  CHECK(pg::classify_error(pqxx::undefined_function("ERROR:  function does not exist")) ==
        DbErrorClass::kUndefinedObject);
  CHECK(pg::classify_error(pqxx::syntax_error("ERROR:  syntax error")) == DbErrorClass::kOther);
  CHECK(pg::classify_error(pqxx::serialization_failure("ERROR:  could not serialize")) == DbErrorClass::kTransient);
  CHECK(pg::classify_error(pqxx::deadlock_detected("ERROR:  deadlock detected")) == DbErrorClass::kTransient);
  CHECK(pg::classify_error(pqxx::too_many_connections("FATAL:  too many connections")) == DbErrorClass::kTransient);
  CHECK(pg::classify_error(pqxx::disk_full("ERROR:  could not extend file")) == DbErrorClass::kTransient);
  CHECK(pg::classify_error(pqxx::in_doubt_error("commit outcome unknown")) == DbErrorClass::kTransient);
  CHECK(pg::describe_error(pqxx::insufficient_privilege("ERROR:  permission denied\n")) ==
        "SQLSTATE 42501: ERROR:  permission denied");
}

TEST_CASE("translate_errors: StoreUnavailable of the error's class, with the hint for the operator") {
  const pg::HintContext hints{"relay", "outbox_events"};
  try {
    pg::translate_errors(
        "claim", [] { throw pqxx::insufficient_privilege("ERROR:  permission denied", "", "42501"); }, hints);
    FAIL("no exception");
  } catch (const StoreUnavailable& e) {
    CHECK(e.kind() == DbErrorClass::kPrivilege);
    CHECK(std::string(e.what()) == "claim: SQLSTATE 42501: ERROR:  permission denied");
    CHECK(e.hint().find("GRANT outbox_relay TO relay") != std::string::npos);
  }
  try {
    pg::translate_errors(
        "claim", [] { throw pqxx::broken_connection("server closed the connection unexpectedly"); }, hints);
    FAIL("no exception");
  } catch (const StoreUnavailable& e) {
    CHECK(e.kind() == DbErrorClass::kTransient);
    CHECK(e.hint().empty());
  }
}

TEST_CASE("url_user: the login role of a URL or a keyword string") {
  CHECK(pg::url_user("postgresql://relay:secret@127.0.0.1:5432/app") == "relay");
  CHECK(pg::url_user("host=127.0.0.1 user=outbox password='x y' dbname=app") == "outbox");
}

TEST_CASE("with_session_defaults: libpq's settings for a dead server, where the string sets none") {
  unsetenv("PGCONNECT_TIMEOUT");
  const std::string all =
      "connect_timeout=10 keepalives_idle=10 keepalives_interval=5 keepalives_count=3 tcp_user_timeout=30000";
  CHECK(pg::with_session_defaults("host=127.0.0.1 dbname=app") == "host=127.0.0.1 dbname=app " + all);
  CHECK(pg::with_session_defaults("") == all);  // everything else from the environment, as before
  CHECK(pg::with_session_defaults("postgresql://relay:secret@db:5432/app") ==
        "postgresql://relay:secret@db:5432/app?connect_timeout=10&keepalives_idle=10&keepalives_interval=5&"
        "keepalives_count=3&tcp_user_timeout=30000");
  // What the string sets stands, and is not given twice.
  CHECK(pg::with_session_defaults("postgres://db/app?sslmode=require&keepalives_idle=60&connect_timeout=3") ==
        "postgres://db/app?sslmode=require&keepalives_idle=60&connect_timeout=3&keepalives_interval=5&"
        "keepalives_count=3&tcp_user_timeout=30000");
  CHECK(pg::with_session_defaults("dbname=app tcp_user_timeout=0 keepalives_count=9") ==
        "dbname=app tcp_user_timeout=0 keepalives_count=9 connect_timeout=10 keepalives_idle=10 keepalives_interval=5");
  // PGCONNECT_TIMEOUT is the operator's connect_timeout.
  setenv("PGCONNECT_TIMEOUT", "4", 1);
  CHECK(pg::with_session_defaults("dbname=app").find("connect_timeout") == std::string::npos);
  unsetenv("PGCONNECT_TIMEOUT");
  // Not parsable: unchanged (libpq's error at connect names the problem).
  CHECK(pg::with_session_defaults("host='unterminated") == "host='unterminated");
}
