#pragma once
// Reload without a restart: SIGHUP (and `outbox-relay reload`, a NOTIFY that the LISTEN session
// turns into a SIGHUP) re-reads the config file. The main thread reads and checks the file and
// builds the new sinks; the runner takes the new sinks, router and options between two batches
// (core/runner.hpp, Runner::post), when nothing is in flight; then the main thread hands the sinks
// to /readyz and the metrics, flushes and drops the sinks that were removed or replaced, and logs
// `config reloaded`. A sink whose entry did not change keeps its object (connection, producer).
// Keys that need new sessions or sockets keep their running values (config/config_diff.hpp), with
// a warning naming each. An invalid file changes nothing: an error per key, with its line.
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "app/ops.hpp"
#include "config/config.hpp"
#include "config/config_diff.hpp"
#include "core/bell.hpp"
#include "core/router.hpp"
#include "core/runner.hpp"
#include "core/sink.hpp"
#include "sinks/registry.hpp"

namespace outbox::app {

// How `run` read its config, to read it again the same way: the command line's options win over
// the file as they did at start.
struct ConfigSource {
  std::string path;          // --config; empty: none (a reload is refused)
  std::string database_url;  // --database-url
  std::string table;         // --table
  std::string log_level;     // --log-level
};

// One config's sinks and router. Sinks are shared with the generation before for the entries that
// did not change; a sink is destroyed with the last generation that holds it.
struct SinkGeneration {
  config::Config config;                     // what the relay runs on (keys that need a restart: their running values)
  std::vector<std::shared_ptr<Sink>> owned;  // in config.sinks order
  std::vector<Sink*> sinks;                  // the same, for the loop and Ops
  std::unique_ptr<Router> router;            // the routes' sink indexes point into `sinks`
};

// The config's routes, with sink names turned into indexes of config.sinks.
Router make_router(const config::Config& config);

// The first generation: every sink built. Throws like the sinks' factories.
SinkGeneration first_generation(config::Config config, const std::vector<sinks::PreparedSink>& prepared);

// Lives on the main thread (the one that takes the signals); every method is called there.
class Reloader {
 public:
  // Everything is borrowed and must outlive this object; `first` is what the loop runs on.
  Reloader(ConfigSource source, SinkGeneration first, Runner& runner, Bell& bell, Ops& ops);
  Reloader(const Reloader&) = delete;
  Reloader& operator=(const Reloader&) = delete;

  // SIGHUP: reads and checks the file, builds the new sinks, posts them to the runner. While one
  // reload waits for the runner, a new request is kept and runs once it is done.
  void request();
  // Finishes a reload the runner has taken (see the top of this file). Returns whether one still
  // waits for the runner.
  bool poll();
  bool waiting() const { return next_.has_value(); }
  // What the loop runs on once poll() returned false (at shutdown, after the loop stopped: a
  // reload it never took is dropped, its new sinks unused).
  const SinkGeneration& current() const { return current_; }

 private:
  // The new generation, or nullopt after logging each error (counted).
  std::optional<SinkGeneration> read_next(config::ConfigDiff& diff);
  void refuse(const std::string& text, const std::vector<std::string>& errors);

  ConfigSource source_;
  SinkGeneration current_;
  std::optional<SinkGeneration> next_;  // posted to the runner, not yet taken
  config::ConfigDiff next_diff_;
  bool again_ = false;  // a request came while next_ waited
  Runner& runner_;
  Bell& bell_;
  Ops& ops_;
};

}  // namespace outbox::app
