#pragma once
// Which database failures a reconnect cures and which need an operator: pure functions, table
// tested (tests/unit/postgres/sqlstate_test.cpp). No libpqxx here.
#include <string>
#include <string_view>

#include "core/db_error.hpp"

namespace outbox::pg {

// The class of a server error by its SQLSTATE. Listed codes and classes only; any other code is
// kOther (retried like a transient error: unknown codes never stop the relay).
DbErrorClass classify_sqlstate(std::string_view sqlstate);

// Whether a failed statement that wrote the outcomes of several events may have failed on one
// event's row alone (an index entry too large for its key, a value the server cannot convert, a
// constraint an old row breaks): the outcomes are then written one event at a time, and an event
// whose own outcome cannot be written is dead-lettered with the reason. Listed codes only.
bool row_tied_sqlstate(std::string_view sqlstate);

// The class of a failed connection attempt by libpq's message. libpq gives no SQLSTATE for a
// refused login (libpqxx 6.4 throws broken_connection with the server's text), so the FATAL
// messages of an English server are matched; anything else (refused, timed out, lost, a server
// with another lc_messages) is kTransient.
DbErrorClass classify_connection_failure(std::string_view message);

// What the operator should do, for the classes that need one (empty otherwise). user: the login
// role of database.url ("" if it names none); table: database.table.
std::string operator_hint(DbErrorClass kind, const std::string& user, const std::string& table);

}  // namespace outbox::pg
