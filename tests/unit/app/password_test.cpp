#include <doctest/doctest.h>

#include "app/run.hpp"
#include "log/log.hpp"

using outbox::app::database_password;

TEST_CASE("the database password is found in every URL form") {
  CHECK(database_password("postgresql://relay:s3cr%40t@db:5432/app") == "s3cr%40t");
  CHECK(database_password("postgres://relay:pw@db/app?sslmode=require") == "pw");
  CHECK(database_password("postgresql://relay@db/app").empty());
  CHECK(database_password("host=db user=relay password=hunter22 dbname=app") == "hunter22");
  CHECK(database_password("host=db password='with space' dbname=app") == "with space");
  CHECK(database_password("postgresql://db/app?user=relay&password=qwerty") == "qwerty");
}

TEST_CASE("registered secrets are masked in raw, percent-encoded and JSON-escaped forms") {
  outbox::log::add_secret("p@ss\"word");
  CHECK(outbox::log::redact("url postgresql://u:p@ss\"word@h/db") == "url postgresql://u:*****@h/db");
  CHECK(outbox::log::redact("url postgresql://u:p%40ss%22word@h/db") == "url postgresql://u:*****@h/db");
  CHECK(outbox::log::redact(R"({"e":"p@ss\"word"})") == R"({"e":"*****"})");
}
