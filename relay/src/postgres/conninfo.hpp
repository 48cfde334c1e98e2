#pragma once
// What a connection URL or key=value string names, read by libpq's own parser. No libpq types
// here, so callers outside postgres/ need no libpq.
#include <string>

namespace outbox::pg {

// The database the string names: dbname, else its user (libpq's own default), else "". The
// environment (PGDATABASE, PGUSER) is not read; an unparsable string names nothing.
std::string url_database(const std::string& url);

}  // namespace outbox::pg
