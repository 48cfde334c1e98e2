#pragma once
// Shared plumbing for every Postgres session of the relay. Includes libpqxx: for .cpp files of
// this folder only.
#include <pqxx/pqxx>

#include <memory>
#include <string>

#include "core/store.hpp"

namespace outbox::pg {

// Opens a session with reactivation off (a lost session must surface, so that the caller
// re-LISTENs, re-takes its locks and catches up) and application_name set.
std::unique_ptr<pqxx::connection> open_session(const std::string& url, const std::string& role);

// Replaces every `from` in text with `to` (the placeholders of migrations and whole statements).
void replace_all(std::string& text, const std::string& from, const std::string& to);

// Names for the operator's hint (postgres/sqlstate.hpp): the login role and the outbox table.
struct HintContext {
  std::string user;
  std::string table;
};

// Calls fn; turns every libpqxx failure into StoreUnavailable: the message with the password
// masked, its class (classify_error) and, for the classes that need an operator, the hint.
template <class Fn>
auto translate_errors(const char* what, Fn&& fn, const HintContext& hints = {}) -> decltype(fn());

// "SQLSTATE <code>: <message>" (the code when known), trailing newlines dropped, password masked.
std::string describe_error(const std::exception& e);
// The SQLSTATE of a libpqxx exception: its own, or the one its type stands for; "" if none.
std::string sqlstate_of(const std::exception& e);
// The class of any failure of a session: a server error by its SQLSTATE, a failed connection by
// libpq's message (it has no SQLSTATE), a DbError by its own class; anything else is kOther.
DbErrorClass classify_error(const std::exception& e);
// "<what>: <describe_error(e)>" as a StoreUnavailable of e's class, with the hint.
StoreUnavailable store_failure(const char* what, const std::exception& e, const HintContext& hints);
// The login role named by a connection URL or keyword string (libpq's parser), else $PGUSER, else "".
std::string url_user(const std::string& url);

// "{1,2,3}" array literal for integer arrays.
template <class Int>
std::string int_array(const Int* begin, const Int* end);

// Quoted SQL literal usable before a session exists (for fixed identifiers we validated).
std::string table_name_only(const std::string& table);  // "app.outbox_events" -> "outbox_events"
// The prefix of the schema's functions: the bare name without a trailing "_events"
// ("app.outbox_events" -> "outbox": outbox_publish, outbox_claim).
std::string function_prefix(const std::string& table);

}  // namespace outbox::pg

#include "postgres/session_inl.hpp"
