// The composition root: command line in, one of the subcommands out.
#include <CLI/CLI.hpp>

#include <cstdio>
#include <iostream>
#include <nlohmann/json.hpp>

#include "app/run.hpp"
#include "config/config.hpp"
#include "log/log.hpp"
#include "postgres/admin.hpp"
#include "postgres/migrations.hpp"
#include "version.hpp"

namespace {

constexpr int kExitUsage = 2;
constexpr int kExitFailure = 1;

struct Options {
  std::string config_path;
  std::string database_url;
  std::string table;
  std::string log_level;
  bool json = false;
};

// The config for commands that only need the database: from --config if given, else from
// --database-url / DATABASE_URL and defaults.
outbox::config::Config load(const Options& o) {
  const auto env = outbox::config::process_env();
  auto c = o.config_path.empty() ? outbox::config::parse_config("{}", env, o.database_url)
                                 : outbox::config::load_config(o.config_path, env, o.database_url);
  if (!o.table.empty()) {
    c.database.table = outbox::config::parse_config("database: {table: " + o.table + ", url: x}", env).database.table;
  }
  if (!o.log_level.empty()) c.log_level = o.log_level;
  outbox::log::Level level{};
  outbox::log::parse_level(c.log_level, level);
  outbox::log::set_level(level);
  outbox::app::register_secrets(c);
  return c;
}

int print_status(const outbox::config::Config& c, bool json) {
  const auto report = outbox::pg::query_status(c.database.url, c.database.table);
  if (json) {
    nlohmann::json topics = nlohmann::json::array();
    for (const auto& t : report.topics) {
      topics.push_back({{"topic", t.topic}, {"pending", t.pending},
                        {"oldest_pending_age_seconds", t.oldest_pending_age_seconds},
                        {"dead_lettered", t.dead_lettered}});
    }
    std::cout << nlohmann::json{{"pending", report.pending},
                                {"oldest_pending_age_seconds", report.oldest_pending_age_seconds},
                                {"dead_lettered", report.dead_lettered},
                                {"topics", topics}}
                     .dump(2)
              << "\n";
    return 0;
  }
  std::printf("%-40s %10s %14s %14s\n", "TOPIC", "PENDING", "OLDEST_AGE_S", "DEAD_LETTERED");
  for (const auto& t : report.topics) {
    std::printf("%-40s %10lld %14.1f %14lld\n", t.topic.c_str(), t.pending, t.oldest_pending_age_seconds,
                t.dead_lettered);
  }
  std::printf("%-40s %10lld %14.1f %14lld\n", "TOTAL", report.pending, report.oldest_pending_age_seconds,
              report.dead_lettered);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"outbox-relay: moves events from a PostgreSQL outbox table to Kafka, webhooks and files"};
  app.set_version_flag("--version", std::string("outbox-relay ") + outbox::kVersion);
  app.require_subcommand(1);
  Options o;
  app.add_option("--config,-c", o.config_path, "YAML config file")->check(CLI::ExistingFile);
  app.add_option("--database-url", o.database_url,
                 "Postgres URL (overrides database.url; DATABASE_URL fills it when absent). Prefer the "
                 "env var: command lines are visible to other users");
  app.add_option("--table", o.table, "outbox table (default outbox_events)");
  app.add_option("--log-level", o.log_level, "debug | info | warn | error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));

  auto* run = app.add_subcommand("run", "Run the relay until SIGTERM/SIGINT");
  auto* migrate = app.add_subcommand("migrate", "Create or upgrade the outbox schema (idempotent)");
  auto* status = app.add_subcommand("status", "Pending, oldest pending age and dead letters per topic");
  status->add_flag("--json", o.json, "machine-readable output");
  for (auto* sub : {run, migrate, status}) sub->fallthrough();

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }

  outbox::config::Config config;
  try {
    config = load(o);
    if (*run && config.sinks.empty()) throw outbox::config::ConfigError("sinks: expected at least one sink");
  } catch (const outbox::config::ConfigError& e) {
    std::fprintf(stderr, "outbox-relay: config error: %s\n", outbox::log::redact(e.what()).c_str());
    return kExitUsage;
  }

  try {
    if (*run) return outbox::app::run_relay(config);
    if (*migrate) {
      const auto result = outbox::pg::migrate(config.database.url, config.database.table, config.database.channel);
      if (result.applied.empty()) {
        std::printf("schema is up to date (version %d) for %s\n", result.current_version, config.database.table.c_str());
      }
      for (const auto& name : result.applied) std::printf("applied %s to %s\n", name.c_str(), config.database.table.c_str());
      return 0;
    }
    if (*status) return print_status(config, o.json);
  } catch (const outbox::config::ConfigError& e) {
    std::fprintf(stderr, "outbox-relay: config error: %s\n", outbox::log::redact(e.what()).c_str());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outbox-relay: %s\n", outbox::log::redact(e.what()).c_str());
    return kExitFailure;
  }
  return kExitUsage;
}
