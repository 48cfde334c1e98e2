#include <doctest/doctest.h>

#include <map>
#include <string>
#include <vector>

#include "config/config_diff.hpp"
#include "support/env.hpp"

using namespace outbox::config;

namespace {

using Names = std::vector<std::string>;

Config parse(const std::string& yaml, std::map<std::string, std::string> vars = {}) {
  return parse_config(yaml, outbox::testing::env_of(std::move(vars)));
}

const char* kBefore = R"(
database: { url: postgresql://relay@127.0.0.1/app }
relay: { batch_size: 500 }
http: { listen: 127.0.0.1:9187 }
sinks:
  - { name: audit, type: file, path: /tmp/audit.jsonl }
  - { name: hooks, type: webhook, url: "https://h.example.com/in", secrets: ["${HOOK_SECRET}"] }
  - { name: old, type: stdout }
routes:
  - { topics: ["order.*"], sinks: [audit, hooks] }
)";

}  // namespace

TEST_CASE("the same file changes nothing; the order keys are written in does not count") {
  const auto before = parse(kBefore, {{"HOOK_SECRET", "s1"}});
  const auto after = parse(R"(
relay: { batch_size: 500 }
database: { url: postgresql://relay@127.0.0.1/app }
http: { listen: 127.0.0.1:9187 }
sinks:
  - { path: /tmp/audit.jsonl, type: file, name: audit }
  - { name: hooks, type: webhook, url: "https://h.example.com/in", secrets: ["${HOOK_SECRET}"] }
  - { name: old, type: stdout }
routes:
  - { topics: ["order.*"], sinks: [audit, hooks] }
)",
                           {{"HOOK_SECRET", "s1"}});
  const auto d = diff_configs(before, after);
  CHECK(d.changes_nothing());
  CHECK(d.restart_keys.empty());
  CHECK(d.kept == Names{"audit", "hooks", "old"});
}

TEST_CASE("sinks kept, rebuilt, added and removed; routes, batch_size and the log level changed") {
  const auto before = parse(kBefore, {{"HOOK_SECRET", "s1"}});
  const auto after = parse(R"(
database: { url: postgresql://relay@127.0.0.1/app }
relay: { batch_size: 50, poll_interval: 10ms }
log: { level: debug }
http: { listen: 127.0.0.1:9187 }
sinks:
  - { name: audit, type: file, path: /tmp/audit.jsonl }
  - { name: hooks, type: webhook, url: "https://h.example.com/in", secrets: ["${HOOK_SECRET}"] }
  - { name: extra, type: file, path: /tmp/extra.jsonl }
routes:
  - { topics: ["order.*"], sinks: [audit, hooks] }
  - { topics: ["*"], sinks: [extra] }
)",
                           {{"HOOK_SECRET", "s2"}});  // a rotated secret: the same text, another value
  const auto d = diff_configs(before, after);
  CHECK(d.kept == Names{"audit"});
  CHECK(d.rebuilt == Names{"hooks"});
  CHECK(d.added == Names{"extra"});
  CHECK(d.removed == Names{"old"});
  // light_poll_interval follows poll_interval when left out (8ms at least poll_interval).
  CHECK(d.changed ==
        Names{"relay.batch_size", "relay.poll_interval", "relay.light_poll_interval", "log.level", "routes"});
  CHECK(d.restart_keys.empty());
  CHECK_FALSE(d.changes_nothing());
}

TEST_CASE("keys that need a restart are named, and keep their running values") {
  const auto before = parse(kBefore, {{"HOOK_SECRET", "s1"}});
  const auto after = parse(R"(
database: { url: postgresql://relay@127.0.0.1/other, channel: other_channel, table: app.events }
relay: { batch_size: 200, instance_id: relay-9, lease: 30s, retention: 7d }
http: { listen: 0.0.0.0:9999 }
sinks:
  - { name: audit, type: file, path: /tmp/audit.jsonl }
)",
                           {{"HOOK_SECRET", "s1"}});
  const auto d = diff_configs(before, after);
  CHECK(d.restart_keys == Names{"database.url", "database.table", "database.channel", "http.listen",
                                "relay.instance_id", "relay.lease", "relay.retention"});
  CHECK(d.changed == Names{"relay.batch_size", "routes"});
  CHECK(d.removed == Names{"hooks", "old"});

  const auto kept = keep_restart_keys(before, after);
  CHECK(kept.database.url == "postgresql://relay@127.0.0.1/app");
  CHECK(kept.database.channel == "outbox_wakeup");
  CHECK(kept.database.table == "outbox_events");
  CHECK(kept.http.listen == "127.0.0.1:9187");
  CHECK(kept.relay.instance_id.empty());
  CHECK(kept.relay.lease == before.relay.lease);
  CHECK_FALSE(kept.relay.retention.has_value());
  CHECK(kept.relay.batch_size == 200);  // the reloadable part is the new file's
  CHECK(kept.sinks.size() == 1);
  CHECK(kept.routes.empty());
  CHECK(diff_configs(before, kept).restart_keys.empty());
}

TEST_CASE("a sink's fingerprint changes with any value of its entry, not with the order of its keys") {
  const auto a = parse("database: {url: postgresql://h/app}\nsinks:\n  - {name: a, type: file, path: /tmp/a}\n");
  const auto b = parse("database: {url: postgresql://h/app}\nsinks:\n  - {path: /tmp/a, name: a, type: file}\n");
  const auto c =
      parse("database: {url: postgresql://h/app}\nsinks:\n  - {name: a, type: file, path: /tmp/a, fsync: false}\n");
  CHECK(a.sinks[0].fingerprint == b.sinks[0].fingerprint);
  CHECK(a.sinks[0].fingerprint != c.sinks[0].fingerprint);
}

TEST_CASE("tracing.* needs a restart: each changed key is named, the running tracing kept") {
  const std::string base = "database: {url: postgresql://h/app}\nsinks:\n  - {name: a, type: file, path: /tmp/a}\n";
  const auto traced = [&](const std::string& token) {
    return parse(base + R"(
tracing:
  otlp_endpoint: http://127.0.0.1:4318
  headers: { Authorization: "Bearer ${TOKEN}" }
  batch_size: 100
)",
                 {{"TOKEN", token}});
  };
  const auto before = parse(base);
  const auto after = traced("t1");
  const auto d = diff_configs(before, after);
  CHECK(d.restart_keys == Names{"tracing.otlp_endpoint", "tracing.headers", "tracing.batch_size"});
  CHECK(d.changed.empty());
  const auto kept = keep_restart_keys(before, after);
  CHECK_FALSE(kept.tracing.enabled());
  CHECK(diff_configs(before, kept).restart_keys.empty());
  // A rotated header value is a change, though only the key's name is ever shown.
  CHECK(diff_configs(after, traced("t2")).restart_keys == Names{"tracing.headers"});
}
