// The composition root: command line in, one of the subcommands out.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <vector>

#include "app/run.hpp"
#include "config/config.hpp"
#include "config/duration.hpp"
#include "log/log.hpp"
#include "postgres/admin.hpp"
#include "postgres/migrations.hpp"
#include "sinks/registry.hpp"
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
  // failed / replay
  std::string topic;
  long long limit = 100;
  std::vector<long long> ids;
  bool all = false;
  std::string older_than;
  long long from_id = 0;
  long long to_id = 0;
  int to_version = 0;  // migrate
  bool print = false;  // config check
};

// The config for commands that only need the database: from --config if given, else from
// --database-url / DATABASE_URL and defaults.
outbox::config::Config load(const Options& o) {
  const auto env = outbox::config::process_env();
  auto c = o.config_path.empty() ? outbox::config::parse_config("{}", env, o.database_url)
                                 : outbox::config::load_config(o.config_path, env, o.database_url);
  if (!o.table.empty()) c.database.table = outbox::config::table_option(o.table);
  if (!o.log_level.empty()) c.log_level = o.log_level;
  outbox::log::Level level{};
  outbox::log::parse_level(c.log_level, level);
  outbox::log::set_level(level);
  outbox::app::register_secrets(c);
  return c;
}

// `config check`: every error of the file (each section, sink and route read on after its own
// error), each with the line of its key, and exit 2; else OK, or with --print the effective config
// with defaults filled in and secrets masked (as `run` logs it at start). Connects to nothing.
int check_config(const Options& o) {
  if (o.config_path.empty()) {
    std::fprintf(stderr, "outbox-relay: config check: --config is required\n");
    return kExitUsage;
  }
  std::ifstream in(o.config_path);
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> errors;
  outbox::config::Config c;
  try {
    c = outbox::config::parse_config(text.str(), outbox::config::process_env(), o.database_url, &errors);
    if (!o.table.empty()) c.database.table = outbox::config::table_option(o.table);
  } catch (const outbox::config::ConfigError& e) {  // not YAML at all, or a bad --table
    errors.emplace_back(e.what());
  }
  if (c.sinks.empty() && errors.empty()) errors.emplace_back("sinks: expected at least one sink");
  const auto prepared = outbox::app::prepare_sinks(c, &errors);
  outbox::app::apply_sink_defaults(c, prepared);
  outbox::app::register_secrets(c);
  for (const auto& e : errors) {
    std::fprintf(stderr, "outbox-relay: config error: %s\n",
                 outbox::log::redact(outbox::config::with_line(text.str(), e)).c_str());
  }
  if (!errors.empty()) return kExitUsage;
  if (!o.print) {
    std::printf("config OK: %s (%zu sinks, %zu routes)\n", o.config_path.c_str(), c.sinks.size(), c.routes.size());
    return 0;
  }
  auto effective = outbox::config::describe(c);
  effective["sinks"] = outbox::sinks::describe(prepared);
  effective["log"] = {{"level", c.log_level}};
  std::printf("%s\n", effective.dump(2).c_str());
  return 0;
}

nlohmann::json open_writer_json(const outbox::pg::OpenWriterStatus& w) {
  return {{"pid", w.pid},
          {"application_name", w.application_name},
          {"client_addr", w.client_addr},
          {"state", w.state},
          {"transaction_age_seconds", w.xact_age_seconds},
          {"query", w.query},
          {"wait_event", w.wait_event},
          {"lanes_known", w.lanes_known},
          {"lanes", w.lanes},
          {"events_held", w.events_held},
          {"gid", w.gid},
          {"owner", w.owner},
          {"database", w.database}};
}

int print_status(const outbox::config::Config& c, bool json) {
  const auto report = outbox::pg::query_status(c.database.url, c.database.table);
  if (json) {
    nlohmann::json topics = nlohmann::json::array();
    for (const auto& t : report.topics) {
      topics.push_back({{"topic", t.topic},
                        {"pending", t.pending},
                        {"oldest_pending_age_seconds", t.oldest_pending_age_seconds},
                        {"dead_lettered", t.dead_lettered}});
    }
    nlohmann::json writers = nlohmann::json::array();
    for (const auto& w : report.open_writers) writers.push_back(open_writer_json(w));
    std::cout << nlohmann::json{{"pending", report.pending},
                                {"oldest_pending_age_seconds", report.oldest_pending_age_seconds},
                                {"dead_lettered", report.dead_lettered},
                                {"topics", topics},
                                {"open_writers", writers}}
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
  if (!report.open_writers.empty()) {
    // docs/operations.md "An event stream stalled: find the writer".
    std::printf("\nOpen writer transactions that may hold events back (oldest first):\n");
    for (const auto& w : report.open_writers) {
      std::string lanes = w.lanes_known ? "" : "all (its current statement inserts, or its activity is not visible)";
      for (int lane : w.lanes_known ? w.lanes : std::vector<int>{})
        lanes += (lanes.empty() ? "" : ",") + std::to_string(lane);
      if (!w.gid.empty()) {
        // No backend: COMMIT PREPARED or ROLLBACK PREPARED ends it.
        std::printf("  prepared transaction '%s'  owner %s  database %s  age %.1f s  lanes %s  events held %lld\n",
                    w.gid.c_str(), w.owner.c_str(), w.database.c_str(), w.xact_age_seconds, lanes.c_str(),
                    w.events_held);
        continue;
      }
      std::printf(
          "  pid %d  application %s  client %s  state %s  age %.1f s  lanes %s  events held %lld\n"
          "    query: %s\n",
          w.pid, w.application_name.empty() ? "-" : w.application_name.c_str(),
          w.client_addr.empty() ? "-" : w.client_addr.c_str(), w.state.empty() ? "(not visible)" : w.state.c_str(),
          w.xact_age_seconds, lanes.c_str(), w.events_held, w.query.c_str());
    }
  }
  return 0;
}

// A CLI11 check: the option's value must not be empty.
std::string not_empty(const std::string& value) { return value.empty() ? "must not be empty" : ""; }

std::optional<std::string> topic_filter(const Options& o) {
  return o.topic.empty() ? std::nullopt : std::optional<std::string>(o.topic);
}

int print_dead_letters(const outbox::config::Config& c, const Options& o) {
  const auto page = outbox::pg::list_dead_letters(c.database.url, c.database.table, topic_filter(o), o.limit);
  if (o.json) {
    nlohmann::json events = nlohmann::json::array();
    for (const auto& d : page.rows) {
      events.push_back({{"id", d.id},
                        {"topic", d.topic},
                        {"key", d.key},
                        {"attempts", d.attempts},
                        {"dead_lettered_at", d.dead_lettered_at},
                        {"last_error", d.last_error}});
    }
    std::cout << nlohmann::json{{"total", page.total}, {"events", events}}.dump(2) << "\n";
    return 0;
  }
  std::printf("%-12s %-24s %-24s %8s  %-27s %s\n", "ID", "TOPIC", "KEY", "ATTEMPTS", "DEAD_LETTERED_AT", "LAST_ERROR");
  for (const auto& d : page.rows) {
    std::string error = d.last_error.substr(0, 200);
    for (char& ch : error) {
      if (ch == '\n' || ch == '\r' || ch == '\t') ch = ' ';
    }
    std::printf("%-12lld %-24s %-24s %8d  %-27s %s\n", d.id, d.topic.c_str(), d.key.c_str(), d.attempts,
                d.dead_lettered_at.c_str(), error.c_str());
  }
  std::printf("%zu of %lld dead-lettered events shown%s\n", page.rows.size(), page.total,
              static_cast<long long>(page.rows.size()) < page.total ? " (raise --limit to see more)" : "");
  return 0;
}

// What a changing command did: a line for people, or one JSON object with --json
// ({"action","count","id_ranges":[[first,last],...]} plus `extra`).
void print_change(const char* action, const std::string& what, const outbox::pg::IdRanges& ids, bool json,
                  nlohmann::json extra = nlohmann::json::object()) {
  if (json) {
    nlohmann::json ranges = nlohmann::json::array();
    for (const auto& [first, last] : ids.ranges()) ranges.push_back({first, last});
    extra.update(nlohmann::json{{"action", action}, {"count", ids.count()}, {"id_ranges", ranges}});
    std::cout << extra.dump() << "\n";
    return;
  }
  std::printf("%s %lld %s (ids: %s)\n", action, ids.count(), what.c_str(), ids.describe().c_str());
}

int retry_failed(const outbox::config::Config& c, const Options& o) {
  outbox::pg::RetrySelection selection{o.ids, topic_filter(o), o.all};
  const auto changed = outbox::pg::retry_dead_letters(c.database.url, c.database.table, c.database.channel, selection);
  std::vector<long long> missed;  // --id values that were not dead letters
  for (long long id : o.ids) {
    bool hit = false;
    for (const auto& [first, last] : changed.ranges()) hit = hit || (id >= first && id <= last);
    if (!hit) missed.push_back(id);
  }
  print_change("retried", "dead-lettered events; they are pending again, attempts reset to 0", changed, o.json,
               o.ids.empty() ? nlohmann::json::object() : nlohmann::json{{"unchanged_ids", missed}});
  if (!o.json) {
    for (long long id : missed) std::printf("unchanged: event %lld is not dead-lettered (or does not exist)\n", id);
  }
  return 0;
}

// The subcommands, to ask which one the command line chose.
struct Commands {
  CLI::App* run = nullptr;
  CLI::App* migrate = nullptr;
  CLI::App* status = nullptr;
  CLI::App* failed = nullptr;
  CLI::App* failed_list = nullptr;
  CLI::App* failed_retry = nullptr;
  CLI::App* failed_purge = nullptr;
  CLI::App* replay = nullptr;
  CLI::App* config = nullptr;
  CLI::App* config_check = nullptr;
  CLI::App* reload = nullptr;
  CLI::Option* to_id = nullptr;  // replay --to-id, given or not
};

// Defines the options and subcommands on app, parsed into o.
Commands define_commands(CLI::App& app, Options& o) {
  Commands c;
  app.set_version_flag("--version", std::string("outbox-relay ") + outbox::kVersion);
  app.require_subcommand(1);
  app.add_option("--config,-c", o.config_path, "YAML config file")->check(CLI::ExistingFile);
  app.add_option("--database-url", o.database_url,
                 "Postgres URL (overrides database.url; DATABASE_URL fills it when absent). Prefer the "
                 "env var: command lines are visible to other users");
  app.add_option("--table", o.table, "outbox table (default outbox_events)");
  app.add_option("--log-level", o.log_level, "debug | info | warn | error")
      ->check(CLI::IsMember({"debug", "info", "warn", "error"}));

  c.run = app.add_subcommand("run", "Run the relay until SIGTERM/SIGINT (SIGHUP reloads the config file)");
  c.migrate = app.add_subcommand("migrate", "Create or upgrade the outbox schema (idempotent)");
  c.migrate->add_option("--to-version", o.to_version, "stop after this schema version (default: the newest)")
      ->check(CLI::PositiveNumber);
  c.status = app.add_subcommand("status", "Pending, oldest pending age and dead letters per topic");
  c.status->add_flag("--json", o.json, "machine-readable output");

  c.failed = app.add_subcommand("failed", "Dead-lettered events: list, retry, purge");
  c.failed->require_subcommand(1);
  c.failed_list =
      c.failed->add_subcommand("list", "Dead-lettered events, oldest first: id, topic, key, attempts, last_error");
  c.failed_list->add_option("--topic", o.topic, "only events of this topic")->check(not_empty);
  c.failed_list->add_option("--limit", o.limit, "show at most N events (default 100)")->check(CLI::PositiveNumber);
  c.failed_list->add_flag("--json", o.json, "machine-readable output");
  c.failed_retry = c.failed->add_subcommand(
      "retry",
      "Put dead-lettered events back to pending (attempts reset to 0, last_error kept until the next attempt)");
  auto* selection = c.failed_retry->add_option_group("selection", "which dead letters (exactly one of)");
  selection->add_option("--id", o.ids, "event id (repeatable)")->check(CLI::PositiveNumber);
  selection->add_option("--topic", o.topic, "every dead letter of this topic")->check(not_empty);
  selection->add_flag("--all", o.all, "every dead letter");
  selection->require_option(1);
  c.failed_retry->add_flag("--json", o.json, "machine-readable output");
  c.failed_purge =
      c.failed->add_subcommand("purge", "Delete dead-lettered events that were dead-lettered longer ago than a bound");
  c.failed_purge->add_option("--older-than", o.older_than, "a duration such as 7d, 12h or 30m")->required();
  c.failed_purge->add_option("--topic", o.topic, "only events of this topic")->check(not_empty);
  c.failed_purge->add_flag("--json", o.json, "machine-readable output");

  c.replay =
      app.add_subcommand("replay", "Make processed events pending again, so that every routed sink gets them again");
  c.replay->add_option("--from-id", o.from_id, "first event id")->required()->check(CLI::PositiveNumber);
  c.to_id =
      c.replay->add_option("--to-id", o.to_id, "last event id (default: no upper bound)")->check(CLI::PositiveNumber);
  c.replay->add_option("--topic", o.topic, "only events of this topic")->check(not_empty);
  c.replay->add_flag("--json", o.json, "machine-readable output");

  c.config = app.add_subcommand("config", "Check a config file without connecting to anything");
  c.config->require_subcommand(1);
  c.config_check = c.config->add_subcommand(
      "check", "Parse and validate --config (and the environment it refers to); print every error with its line");
  c.config_check->add_flag("--print", o.print, "print the effective config, defaults filled in, secrets masked");

  c.reload = app.add_subcommand(
      "reload",
      "Ask the running relays to re-read their config files (NOTIFY on database.channel; the same as SIGHUP)");

  for (auto* sub : {c.run, c.migrate, c.status, c.failed, c.failed_list, c.failed_retry, c.failed_purge, c.replay,
                    c.config, c.config_check, c.reload}) {
    sub->fallthrough();
  }
  return c;
}

}  // namespace

// What may escape main is CLI11's ConstructionError, a mistake in define_commands that every
// test run would show: std::terminate is the right end for it.
// NOLINTNEXTLINE(bugprone-exception-escape)
int main(int argc, char** argv) {
  // libpq waits forever for an unanswered connect by default; bound it so reconnect loops and
  // shutdown stay responsive when the database host vanishes. The operator's value wins.
  setenv("PGCONNECT_TIMEOUT", "10", /*overwrite=*/0);
  CLI::App app{
      "outbox-relay: moves events from a PostgreSQL outbox table to Kafka, webhooks, files, "
      "NATS JetStream, RabbitMQ and Redis Streams"};
  Options o;
  const Commands c = define_commands(app, o);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    const int code = app.exit(e);
    return code == 0 ? 0 : kExitUsage;
  }

  std::chrono::milliseconds older_than{0};
  if (*c.failed_purge) {
    const auto parsed = outbox::config::parse_duration(o.older_than);
    if (!parsed) {
      std::fprintf(stderr, "outbox-relay: --older-than: expected a duration such as 7d, 12h or 30m, got '%s'\n",
                   o.older_than.c_str());
      return kExitUsage;
    }
    older_than = *parsed;
  }
  if (*c.replay && *c.to_id && o.to_id < o.from_id) {
    std::fprintf(stderr, "outbox-relay: --to-id: must not be less than --from-id (%lld), got %lld\n", o.from_id,
                 o.to_id);
    return kExitUsage;
  }

  if (*c.config_check) return check_config(o);

  outbox::config::Config config;
  try {
    config = load(o);
    // Every command refuses a config whose sinks are wrong; `run` reads them once, in run_relay.
    if (!*c.run) outbox::app::prepare_sinks(config);
    if (*c.run && config.sinks.empty()) throw outbox::config::ConfigError("sinks: expected at least one sink");
  } catch (const outbox::config::ConfigError& e) {
    std::fprintf(stderr, "outbox-relay: config error: %s\n", outbox::log::redact(e.what()).c_str());
    return kExitUsage;
  }

  try {
    if (*c.run) return outbox::app::run_relay(config, {o.config_path, o.database_url, o.table, o.log_level});
    if (*c.reload) {
      outbox::pg::request_reload(config.database.url, config.database.table, config.database.channel);
      std::printf("reload requested: NOTIFY %s, 'reload' (every relay listening on it re-reads its config file)\n",
                  config.database.channel.c_str());
      return 0;
    }
    if (*c.migrate) {
      const auto result = outbox::pg::migrate(config.database.url, config.database.table, config.database.channel,
                                              config.database.roles, o.to_version);
      if (result.applied.empty()) {
        std::printf("schema is up to date (version %d) for %s\n", result.current_version,
                    config.database.table.c_str());
      }
      for (const auto& name : result.applied)
        std::printf("applied %s to %s\n", name.c_str(), config.database.table.c_str());
      for (const auto& warning : result.warnings)
        std::fprintf(stderr, "outbox-relay: migrate: %s\n", outbox::log::redact(warning).c_str());
      return 0;
    }
    if (*c.status) return print_status(config, o.json);
    if (*c.failed_list) return print_dead_letters(config, o);
    if (*c.failed_retry) return retry_failed(config, o);
    if (*c.failed_purge) {
      const auto purged =
          outbox::pg::purge_dead_letters(config.database.url, config.database.table, older_than, topic_filter(o));
      print_change("purged", "dead-lettered events older than " + outbox::config::format_duration(older_than), purged,
                   o.json);
      return 0;
    }
    if (*c.replay) {
      const auto replayed =
          outbox::pg::replay_processed(config.database.url, config.database.table, config.database.channel, o.from_id,
                                       *c.to_id ? std::optional<long long>(o.to_id) : std::nullopt, topic_filter(o));
      print_change("replayed", "processed events; they are pending again", replayed, o.json);
      return 0;
    }
  } catch (const outbox::config::ConfigError& e) {
    std::fprintf(stderr, "outbox-relay: config error: %s\n", outbox::log::redact(e.what()).c_str());
    return kExitUsage;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "outbox-relay: %s\n", outbox::log::redact(e.what()).c_str());
    return kExitFailure;
  }
  return kExitUsage;
}
