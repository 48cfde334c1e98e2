#pragma once
// Shared plumbing for every Postgres session of the relay. Includes libpqxx: for .cpp files of
// this folder only.
#include <pqxx/pqxx>

#include <memory>
#include <optional>
#include <string>

#include "core/store.hpp"

namespace outbox::pg {

// Opens a session with reactivation off (a lost session must surface, so that the caller
// re-LISTENs, re-takes its locks and catches up) and application_name set. pinned: search_path is
// set to pg_catalog, pg_temp, so that no name, operator, function or cast of a statement resolves
// to anything a writer created in a schema of the role's path (the statements name the outbox's
// objects by TableNames), and every other setting the statements' meaning depends on is set too
// (client_encoding, row_security, the transaction defaults, ...: session.cpp lists them). `migrate`
// pins too: its files name the table and its functions schema-qualified.
std::unique_ptr<pqxx::connection> open_session(const std::string& url, const std::string& role, bool pinned = true);

// The outbox table's objects as the relay's statements name them: schema-qualified and quoted.
struct TableNames {
  std::string table;       // "public"."outbox_events"
  std::string functions;   // "public".outbox: its functions are functions + "_claim", ...
  std::string migrations;  // "public"."outbox_schema_migrations"
  bool found = false;      // false: the table does not exist (yet); the names are unqualified
  // The table's schema, unquoted: where it is, or where `migrate` makes it (the configured one,
  // else the first schema of the role's path); "" when there is none.
  std::string schema;
  // The schema of its functions, unquoted: the table's own, or where an earlier release made them
  // (the first schema of `migrate`'s path); "" when not found.
  std::string function_schema;
  // The seed of the table's advisory-lock namespaces (lock_key()); "" when not found.
  std::string lock_key;
  std::string function(const char* suffix) const { return functions + "_" + suffix; }
};

// Resolves database.table once per process, on a session of its own with the role's own
// search_path: a qualified name as it is; an unqualified one to the one schema of the path that
// holds a table of that name (several: AmbiguousTable, naming them). The functions: in the table's
// schema, else in the first schema of the path holding the claim function owned by the table's
// owner (a function a writer made is never taken). The result is kept for the process once the
// table exists, so a table made later to shadow it changes nothing. Throws pqxx errors when the
// database cannot be reached (the caller's reconnect retries).
TableNames table_names(const std::string& url, const std::string& table);

// The seed of an outbox table's advisory-lock namespaces (the relays' members and lanes, the
// writers' fences and marks): its name in `public`, else "schema.name". Two tables of one name in
// two schemas get namespaces of their own (they shared them when the seed was database.table as
// written, unqualified, and one table's open writer held the other's lanes); an installation in
// `public` keeps the namespaces it had.
std::string lock_key(const std::string& schema, const std::string& name);

// Schema 12's claim function's arguments, lane by lane (the only one this relay calls), and
// schema 10's, which a table migrated to 10 or 11 has.
inline constexpr const char* kClaimFunctionArgs =
    "(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, bigint, bigint[], bigint[], "
    "timestamptz, bigint)";
inline constexpr const char* kSchema10ClaimFunctionArgs =
    "(text, bigint, smallint[], integer, bigint, boolean, bigint[], jsonb, boolean, bigint, bigint[], bigint[], "
    "timestamptz)";

// Two outbox tables whose functions are one: a table's functions are named after the bare table
// name (function_prefix); releases before functions lived in the table's schema made them where
// `migrate` ran, so `s1.outbox_events` and `s2.outbox_events` both made `outbox_claim` there; the
// second migrate replaced the first's and the first table's events were marked processed by the
// second's relay (issue 43). Returns why `function`
// (a regprocedure text: "public.outbox_claim(text, ...)" or unqualified, resolved on the session's
// path) does not serve `table` (as configured; an unqualified one resolved on the path, or to be
// made in current_schema()), naming the table it does serve; nullopt when it serves it or does not
// exist. `migrate` refuses then, and `run` exits 1.
std::optional<std::string> functions_of_another_table(pqxx::transaction_base& tx, const std::string& function,
                                                      const std::string& table);

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

// An identifier quoted as quote_ident() always does ("a""b" for a"b), without a session.
std::string quote_identifier(const std::string& name);
// Quoted SQL literal usable before a session exists (for fixed identifiers we validated).
std::string table_name_only(const std::string& table);  // "app.outbox_events" -> "outbox_events"
// The prefix of the schema's functions: the bare name without a trailing "_events"
// ("app.outbox_events" -> "outbox": outbox_publish, outbox_claim).
std::string function_prefix(const std::string& table);

}  // namespace outbox::pg

#include "postgres/session_inl.hpp"
