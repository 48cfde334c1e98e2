#pragma once
// Shared plumbing for every Postgres session of the relay. Includes libpqxx: for .cpp files of
// this folder only.
#include <pqxx/pqxx>

#include <memory>
#include <string>

namespace outbox::pg {

// Opens a session with reactivation off (a lost session must surface, so that the caller
// re-LISTENs, re-takes its locks and catches up) and application_name set.
std::unique_ptr<pqxx::connection> open_session(const std::string& url, const std::string& role);

// Calls fn; turns every libpqxx failure into StoreUnavailable with the password masked.
template <class Fn>
auto translate_errors(const char* what, Fn&& fn) -> decltype(fn());

std::string describe_error(const std::exception& e);

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
