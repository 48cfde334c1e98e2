#pragma once
// What a connection URL or key=value string names, read by libpq's own parser. No libpq types
// here, so callers outside postgres/ need no libpq.
#include <string>

namespace outbox::pg {

// The database the string names: dbname, else its user (libpq's own default), else "". The
// environment (PGDATABASE, PGUSER) is not read; an unparsable string names nothing.
std::string url_database(const std::string& url);

// The string with libpq's settings for noticing a dead server added where it sets none of them
// (nor the environment, for connect_timeout): connect_timeout 10 s; TCP keepalives after 10 s
// idle, every 5 s, 3 unanswered = dead; tcp_user_timeout 30 s. libpq's own defaults wait for the
// kernel's: a connection attempt to a host that drops packets ~2 min, a statement whose server
// vanished without a reset (a failover that moves the address, a partition) ~15 min, an idle or
// listening session forever; meanwhile the relay holds no lanes there and publishes nothing. A
// URI gets them as query parameters, a keyword string as keywords. Unix sockets ignore them.
std::string with_session_defaults(const std::string& url);

}  // namespace outbox::pg
