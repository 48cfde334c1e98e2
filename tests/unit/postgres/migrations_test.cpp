#include <doctest/doctest.h>

#include <string>

#include "postgres/migrations.hpp"
#include "postgres/pg_store.hpp"
#include "postgres/session.hpp"

using outbox::pg::embedded_migrations;
using outbox::pg::render_migration;

TEST_CASE("migrations are embedded in version order") {
  const auto& m = embedded_migrations();
  REQUIRE(!m.empty());
  CHECK(m.front().version == 1);
  for (std::size_t i = 1; i < m.size(); ++i) CHECK(m[i].version > m[i - 1].version);
}

TEST_CASE("the relay runs on the newest embedded schema, which `run` requires") {
  CHECK(embedded_migrations().back().version == outbox::pg::kSchemaVersion);
}

TEST_CASE("placeholders are filled: the table and its functions qualified by the table's schema") {
  const std::string sql =
      "{{table}} {{name}}_idx {{fn}}_publish {{prefix}}_fence '{{channel}}' {{mark_ns}} {{writer_role}} {{relay_role}}";
  const auto mark = [](const std::string& seed) { return std::to_string(outbox::pg::writer_mark_keys(seed).lanes); };
  CHECK(render_migration(sql, {"public", "outbox_events", "public", "outbox", "outbox_events"}, "outbox_wakeup") ==
        "\"public\".\"outbox_events\" outbox_events_idx \"public\".outbox_publish outbox_fence 'outbox_wakeup' " +
            mark("outbox_events") + " outbox_writer outbox_relay");
  CHECK(render_migration(sql, {"billing", "invoice_events", "billing", "billing", "billing.invoice_events"}, "bell") ==
        "\"billing\".\"invoice_events\" invoice_events_idx \"billing\".invoice_publish invoice_fence 'bell' " +
            mark("billing.invoice_events") + " billing_writer billing_relay");
  CHECK(render_migration(sql, {"a\"b", "jobs", "a\"b", "jobs", "x"}, "c") ==
        "\"a\"\"b\".\"jobs\" jobs_idx \"a\"\"b\".jobs_publish jobs_fence 'c' " + mark("x") + " jobs_writer jobs_relay");
  const std::string rendered =
      render_migration(embedded_migrations().front().sql,
                       {"public", "outbox_events", "public", "outbox", "outbox_events"}, "outbox_wakeup");
  CHECK(rendered.find("{{") == std::string::npos);
  CHECK(rendered.find("FUNCTION \"public\".outbox_publish(") != std::string::npos);
  CHECK(rendered.find("pg_notify('outbox_wakeup', '')") != std::string::npos);
}

TEST_CASE("two tables of one name in two schemas get lock namespaces of their own; public keeps its own") {
  using outbox::pg::lock_key;
  CHECK(lock_key("public", "outbox_events") == "outbox_events");
  CHECK(lock_key("s1", "outbox_events") == "s1.outbox_events");
  CHECK(lock_key("s1", "outbox_events") != lock_key("s2", "outbox_events"));
}

TEST_CASE("every embedded migration renders without a placeholder left") {
  for (const auto& m : embedded_migrations()) {
    CAPTURE(m.name);
    CHECK(render_migration(m.sql, {"billing", "invoice_events", "billing", "billing", "billing.invoice_events"}, "bell")
              .find("{{") == std::string::npos);
  }
}

TEST_CASE("the indexes a migration creates, which migrate builds concurrently first") {
  using outbox::pg::indexes_created;
  const auto found = indexes_created(
      "-- a comment that names CREATE INDEX IF NOT EXISTS x ON y;\n"
      "CREATE INDEX IF NOT EXISTS t_a_idx ON \"s\".\"t\" (id)\n  WHERE done IS NULL;\n"
      "  CREATE INDEX IF NOT EXISTS indented ON t (id);\n"
      "CREATE INDEX IF NOT EXISTS t_b_idx ON \"s\".\"t\" (pg_catalog.hashtextextended(k, 0), id);");
  REQUIRE(found.size() == 2);
  CHECK(found[0].name == "t_a_idx");
  CHECK(found[0].definition == "ON \"s\".\"t\" (id)\n  WHERE done IS NULL");
  CHECK(found[1].name == "t_b_idx");
  CHECK(found[1].definition == "ON \"s\".\"t\" (pg_catalog.hashtextextended(k, 0), id)");
  // Schema 1 makes the table and its indexes in one go; schema 13 builds its index first.
  const outbox::pg::MigrationTarget target{"public", "outbox_events", "public", "outbox", "outbox_events"};
  CHECK(indexes_created(render_migration(embedded_migrations().front().sql, target, "c")).size() == 4);
  const auto retry = indexes_created(render_migration(embedded_migrations().at(12).sql, target, "c"));
  REQUIRE(retry.size() == 1);
  CHECK(retry[0].name == "outbox_events_retry_hash_idx");
  CHECK(
      retry[0].definition.starts_with("ON \"public\".\"outbox_events\" (pg_catalog.hashtextextended(aggregate_id, 0)"));
}
