#pragma once
// The option structs of the loop, the runner, the store and the listener, built from the config:
// config/config.hpp holds every default, these structs none of their own.
#include <string>

#include "config/config.hpp"
#include "core/health.hpp"
#include "core/loop.hpp"
#include "core/runner.hpp"
#include "postgres/listener.hpp"
#include "postgres/pg_store.hpp"
#include "tracing/otlp_exporter.hpp"

namespace outbox::app {

LoopOptions loop_options(const config::Config& config);
RunnerOptions runner_options(const config::Config& config);
// health: where the store reports a transaction pooler (may be null); must outlive the store.
pg::PgStoreOptions store_options(const config::Config& config, std::string instance_id, Health* health);
pg::WatchOptions watch_options(const config::Config& config);
// For a config with tracing.enabled(); the resource names this instance.
tracing::ExporterOptions exporter_options(const config::Config& config, const std::string& instance_id);

}  // namespace outbox::app
