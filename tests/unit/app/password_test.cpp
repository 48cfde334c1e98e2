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

TEST_CASE("the default CloudEvents source names the database of the URL, else its user") {
  using outbox::app::default_cloudevents_source;
  CHECK(default_cloudevents_source("postgresql://relay@db/app", "outbox_events") == "outbox-relay/app/outbox_events");
  CHECK(default_cloudevents_source("host=db user=relay dbname=shop", "app.events") == "outbox-relay/shop/app.events");
  CHECK(default_cloudevents_source("postgresql://relay@db", "outbox_events") == "outbox-relay/relay/outbox_events");
  CHECK(default_cloudevents_source("postgresql://db", "outbox_events") == "outbox-relay/outbox_events");
  CHECK(default_cloudevents_source("not a url", "outbox_events") == "outbox-relay/outbox_events");
}
