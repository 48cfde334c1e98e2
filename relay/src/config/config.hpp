#pragma once
// The relay's configuration, parsed once into typed structs. Every default of the relay is written
// here: in the members (the file's keys) and in the settings below that have no key. The option
// structs of the loop, the runner, the store and the listener have no defaults of their own;
// app/options.hpp builds them from a Config.
#include <chrono>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "config/section.hpp"
#include "core/backoff.hpp"

namespace outbox::config {

struct DatabaseConfig {
  std::string url;  // secret: never logged unmasked
  std::string channel = "outbox_wakeup";
  std::string table = "outbox_events";
  // The roles `migrate` makes and grants the table to: <roles>_writer and <roles>_relay. One per
  // table where tables must not reach each other's rows (the default is shared by every table).
  std::string roles = "outbox";
  // Reconnect backoff of the relay's sessions (work and LISTEN): initial doubling up to max, with
  // jitter. An error that needs an operator (docs/operations.md "Database errors") waits max at
  // once.
  BackoffPolicy reconnect{std::chrono::milliseconds{500}, std::chrono::milliseconds{30'000}};
};

enum class OnSuccess { kMark, kDelete };

struct RelaySection {
  // Rows per claim. Left out: 500, or what a sink asks for if more (app::apply_sink_defaults: 2,000
  // with an exactly-once Kafka sink, whose transactions cost per batch).
  std::size_t batch_size = 500;
  bool batch_size_given = false;  // the file sets it: no sink changes it
  // LoopOptions::in_flight_bytes: at most this many bytes of events in a pipelined drain's sinks.
  std::size_t in_flight_bytes = 64ULL << 20;
  std::chrono::milliseconds lease{60'000};
  std::chrono::milliseconds sweep_interval{30'000};
  // How often the relay polls the table for new events while they flow, and (growing to it) once
  // none came for 2 s (docs/design.md "How wakeups work").
  std::chrono::milliseconds poll_interval{5};
  // A light stream is polled up to this far apart (RunnerOptions::light_poll_interval); absent:
  // 8ms, or poll_interval if that is longer.
  std::chrono::milliseconds light_poll_interval{8};
  // ... so that a poll carries about this many events (RunnerOptions::light_poll_events): fewer
  // polls, statements and sink requests per event for up to light_poll_interval of waiting.
  int light_poll_events = 8;
  std::chrono::milliseconds idle_poll_interval{100};
  // Idle, the LISTEN session waits for the next id inside Postgres (postgres/listener.hpp) and
  // the relay polls once a second; off: it polls every idle_poll_interval.
  bool idle_watch = true;
  int max_attempts = 20;
  BackoffPolicy backoff{std::chrono::milliseconds{1'000}, std::chrono::milliseconds{300'000}};
  OnSuccess on_success = OnSuccess::kMark;
  std::chrono::milliseconds shutdown_timeout{10'000};
  std::chrono::milliseconds rebalance_interval{5'000};
  std::string instance_id;  // empty: hostname-pid-random
  // Processed rows older than this are deleted in small batches; nullopt (absent or "off"): kept
  // forever. Dead-lettered rows are never deleted by retention.
  std::optional<std::chrono::milliseconds> retention;
  // How often a retention pass runs (one that found nothing waits longer: app/ops.cpp). A pass a
  // second deletes about a second of events, paced; passes minutes apart deleted minutes of events
  // at once, and writers' commits waited behind the WAL of it (bench/soak.sh).
  std::chrono::milliseconds retention_interval{1'000};
  // A writer transaction that has held events back for this long is named in a warning (then at
  // most once a minute while it goes on): docs/operations.md "An event stream stalled: find the
  // writer".
  std::chrono::milliseconds writer_hold_warning{5'000};

  // Settings with no key in the file (RunnerOptions, LoopOptions and WatchOptions say what they do).
  // Once nothing new was found for this long, polls slow down to idle_poll_interval.
  std::chrono::milliseconds idle_after{2'000};
  // Idle, with the LISTEN session watching the id sequence: polls this far apart, and the length
  // of one watch statement.
  std::chrono::milliseconds watched_poll_interval{1'000};
  // A poll's delivered outcomes wait for up to this long, to be written tens at a time.
  std::chrono::milliseconds outcome_delay{50};
};

struct HttpConfig {
  bool enabled = true;
  std::string listen = "127.0.0.1:9187";
  // How often the backlog gauges (pending, oldest pending age, notification queue) are read.
  std::chrono::milliseconds refresh_interval{10'000};
};

// The relay's own spans over OTLP/HTTP (docs/operations.md "Tracing"). Off while otlp_endpoint is
// empty (the default): then the loop builds no span and no exporter thread runs. A restart key:
// the exporter and its thread are made at start.
struct TracingConfig {
  std::string otlp_endpoint;  // http(s)://host:port[/path]; no path: /v1/traces
  // Sent with every export (e.g. an authorization header of the collector). Secret: never logged.
  std::map<std::string, std::string> headers;
  std::chrono::milliseconds timeout{2'000};          // one export (a POST), connect included
  std::size_t queue_size = 8192;                     // spans waiting for export; more are dropped (counted)
  std::size_t batch_size = 512;                      // spans per export at most
  std::chrono::milliseconds export_interval{1'000};  // what waits is exported at least this often
  std::string service_name = "outbox-relay";         // the resource's service.name
  // Events without a valid traceparent header: a span of a trace of its own (true), or none.
  bool root_spans = false;

  bool enabled() const { return !otlp_endpoint.empty(); }
};

// One entry of `sinks:`. config/ checks its name (unique, used by routes) and keeps the entry as
// written; the sink registry (sinks/registry.hpp) knows the types and reads the rest.
struct SinkConfig {
  std::string name;
  std::string type;  // as written, not checked here
  YamlNode section;  // the whole entry
  std::string path;  // its key path for errors: sinks[N]
  EnvLookup env;     // for ${...} in its values
  // The entry as read: every value ${...}-interpolated when the file was read (a secret rotated in
  // a ${file:...} changes it), keys sorted. Equal fingerprints: the same sink (a reload keeps it).
  // Holds secrets: never logged.
  std::string fingerprint;
};

struct RouteConfig {
  std::vector<std::string> topics;
  std::vector<std::string> sinks;
};

struct Config {
  DatabaseConfig database;
  RelaySection relay;
  HttpConfig http;
  std::string log_level = "info";
  TracingConfig tracing;
  std::vector<SinkConfig> sinks;
  std::vector<RouteConfig> routes;
};

// Parses YAML text. `database_url_override` (from --database-url) wins over the file; the
// DATABASE_URL variable fills database.url when neither gives one. Throws ConfigError.
// errors: when given, every error is collected there instead (each section, sink and route is
// read on after an error of its own; `config check`), and what parsed is returned.
Config parse_config(const std::string& yaml_text, const EnvLookup& env, const std::string& database_url_override = {},
                    std::vector<std::string>* errors = nullptr);
Config load_config(const std::string& path, const EnvLookup& env, const std::string& database_url_override = {});

// An error message of this config ("relay.batch_size: expected ...") with the line its key is
// on in yaml_text in front ("line 12: relay.batch_size: ..."); as it is when the key is not in the
// text (a default, or a key that the message does not start with).
std::string with_line(const std::string& yaml_text, const std::string& message);

// The one rule for outbox table names (database.table, --table): a lower-case SQL identifier,
// optionally schema-qualified ("app.outbox_events"). Throws ConfigError naming `key`.
void check_table_name(const std::string& table, const std::string& key);

// The --table option: a table name as check_table_name() takes it, optionally in one pair of
// matching quotes ('"app.events"', as the YAML-built form of the option accepted). Taken
// literally: no ${...} interpolation, no YAML. Throws ConfigError naming --table.
std::string table_option(const std::string& value);

// The effective configuration as JSON for the startup log, secrets masked. Sinks show their name
// and type (the registry's describe() adds each type's settings).
nlohmann::json describe(const Config& config);
// The tracing section alone, header values masked (config_diff compares it as one restart key).
nlohmann::json describe(const TracingConfig& c);

}  // namespace outbox::config
