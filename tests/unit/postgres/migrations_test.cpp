#include <doctest/doctest.h>

#include <string>

#include "postgres/migrations.hpp"
#include "postgres/pg_store.hpp"

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

TEST_CASE("placeholders are filled for the default and custom tables") {
  const std::string sql = "{{table}} {{name}}_idx {{prefix}}_publish '{{channel}}'";
  CHECK(render_migration(sql, "outbox_events", "outbox_wakeup") ==
        "outbox_events outbox_events_idx outbox_publish 'outbox_wakeup'");
  CHECK(render_migration(sql, "billing.invoice_events", "bell") ==
        "billing.invoice_events invoice_events_idx invoice_publish 'bell'");
  CHECK(render_migration(sql, "jobs", "c") == "jobs jobs_idx jobs_publish 'c'");
  const std::string rendered = render_migration(embedded_migrations().front().sql, "outbox_events", "outbox_wakeup");
  CHECK(rendered.find("{{") == std::string::npos);
  CHECK(rendered.find("FUNCTION outbox_publish(") != std::string::npos);
  CHECK(rendered.find("pg_notify('outbox_wakeup', '')") != std::string::npos);
}

TEST_CASE("every embedded migration renders without a placeholder left") {
  for (const auto& m : embedded_migrations()) {
    CAPTURE(m.name);
    CHECK(render_migration(m.sql, "billing.invoice_events", "bell").find("{{") == std::string::npos);
  }
}
