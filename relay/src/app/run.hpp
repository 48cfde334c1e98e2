#pragma once
#include <string>
#include <vector>

#include "app/reload.hpp"
#include "config/config.hpp"
#include "sinks/registry.hpp"

namespace outbox::app {

// Runs the relay until SIGTERM/SIGINT (exit code 0) or a fatal error (non-zero). Blocks. SIGHUP
// re-reads the config from `source` (app/reload.hpp); `config` is what `source` gave at start.
// Throws config::ConfigError (exit 2) before anything runs when http.listen cannot be bound or
// database.url leads to a transaction pooler (postgres/pooler.hpp).
// Must be called before any other thread exists: it blocks the stop signals and SIGHUP process-wide.
int run_relay(config::Config config, const ConfigSource& source);

// Registers the database password (and other secrets in the config) with the log redactor.
void register_secrets(const config::Config& config);

// The password part of a libpq URL or key=value connection string; empty if none.
std::string database_password(const std::string& url);

// CloudEvents' default `source`: outbox-relay/<database>/<table> (the database from the URL).
std::string default_cloudevents_source(const std::string& database_url, const std::string& table);

// The config's sinks, read by the registry with the default CloudEvents source of its database.
// Throws config::ConfigError naming the key; with errors, keeps each sink's there instead.
std::vector<sinks::PreparedSink> prepare_sinks(const config::Config& config,
                                               std::vector<std::string>* errors = nullptr);
// What the sinks ask of the relay's settings the file leaves out: relay.batch_size, the largest
// any sink prefers (SinkSpec::preferred_batch_size) if above the default. Called wherever sinks
// are prepared for a config that runs, is checked or is reloaded, so all three agree.
void apply_sink_defaults(config::Config& config, const std::vector<sinks::PreparedSink>& prepared);

}  // namespace outbox::app
