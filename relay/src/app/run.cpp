#include "app/run.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <future>
#include <memory>
#include <random>
#include <regex>
#include <thread>

#include "app/ops.hpp"
#include "app/options.hpp"
#include "app/reload.hpp"
#include "core/bell.hpp"
#include "core/health.hpp"
#include "core/loop.hpp"
#include "core/runner.hpp"
#include "log/log.hpp"
#include "postgres/conninfo.hpp"
#include "postgres/listener.hpp"
#include "postgres/pg_store.hpp"
#include "postgres/pooler.hpp"
#include "sinks/registry.hpp"
#include "version.hpp"

namespace outbox::app {
namespace {

std::string default_instance_id() {
  char host[256] = {};
  if (gethostname(host, sizeof host - 1) != 0) std::snprintf(host, sizeof host, "unknown");
  std::mt19937 rng{std::random_device{}()};
  char suffix[16];
  std::snprintf(suffix, sizeof suffix, "%06x", static_cast<unsigned>(rng() & 0xffffff));
  return std::string(host) + "-" + std::to_string(getpid()) + "-" + suffix;
}

}  // namespace

std::string database_password(const std::string& url) {
  static const std::regex kUri("^[a-z]+://[^:/@]*:([^@]*)@.*$");
  static const std::regex kKeyword("(^|\\s)password\\s*=\\s*('([^']*)'|(\\S+))");
  std::smatch m;
  if (std::regex_match(url, m, kUri)) return m[1].str();
  if (std::regex_search(url, m, kKeyword)) return m[3].matched ? m[3].str() : m[4].str();
  static const std::regex kQuery("[?&]password=([^&]*)");
  if (std::regex_search(url, m, kQuery)) return m[1].str();
  return {};
}

std::string default_cloudevents_source(const std::string& database_url, const std::string& table) {
  const std::string database = pg::url_database(database_url);
  return "outbox-relay/" + (database.empty() ? std::string() : database + "/") + table;
}

std::vector<sinks::PreparedSink> prepare_sinks(const config::Config& config, std::vector<std::string>* errors) {
  return sinks::prepare_sinks(config, default_cloudevents_source(config.database.url, config.database.table), errors);
}

void apply_sink_defaults(config::Config& config, const std::vector<sinks::PreparedSink>& prepared) {
  if (config.relay.batch_size_given) return;
  for (const auto& s : prepared)
    config.relay.batch_size = std::max(config.relay.batch_size, s.spec->preferred_batch_size());
}

void register_secrets(const config::Config& config) {
  log::add_secret(database_password(config.database.url));
  if (const char* env = std::getenv("PGPASSWORD")) log::add_secret(env);
}

namespace {

// Blocks SIGTERM, SIGINT and SIGHUP (every thread started later inherits the mask) and ignores
// SIGPIPE. They are taken by sigtimedwait on this thread only, never by a handler.
sigset_t block_signals() {
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGHUP);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return signals;
}

// Returns once the bell is stopped: by SIGTERM or SIGINT, logged, or by anything else. SIGHUP
// reloads the config (app/reload.hpp), here on this thread.
void wait_for_stop(Bell& bell, const sigset_t& signals, Reloader& reloader) {
  const timespec tick{1, 0};                  // only a signal stops the bell today; the tick is a backstop
  const timespec reload_tick{0, 20'000'000};  // while a reload waits for the loop to take it
  while (!bell.stopped()) {
    const int sig = sigtimedwait(&signals, nullptr, reloader.poll() ? &reload_tick : &tick);
    if (sig == SIGHUP) {
      reloader.request();
    } else if (sig == SIGTERM || sig == SIGINT) {
      log::info("stop signal received, finishing the batch in flight",
                {{"signal", sig == SIGTERM ? "SIGTERM" : "SIGINT"},
                 {"timeout_ms", reloader.current().config.relay.shutdown_timeout.count()}});
      bell.stop();
    }
  }
}

}  // namespace

int run_relay(config::Config config, const ConfigSource& source) {
  const sigset_t signals = block_signals();

  const auto prepared = prepare_sinks(config);  // ConfigError naming the key: exit 2
  apply_sink_defaults(config, prepared);
  const std::string instance_id = config.relay.instance_id.empty() ? default_instance_id() : config.relay.instance_id;
  auto described = config::describe(config);
  described["sinks"] = sinks::describe(prepared);
  log::info("starting outbox-relay", {{"version", kVersion}, {"instance_id", instance_id}, {"config", described}});

  // The sinks and router: replaced by reloads (the reloader owns them from its construction on).
  SinkGeneration first = first_generation(config, prepared);

  Bell bell;
  Health health;
  // Declared before ops, whose threads read it, so that it outlives them.
  pg::PgStoreOptions store_settings = store_options(config, instance_id, &health);
  store_settings.lane_groups = lane_groups_of(first.sinks);
  pg::PgStore store(store_settings);
  Ops ops(config, first.sinks, health, bell);  // binds http.listen: ConfigError (exit 2) if it cannot
  Metrics& metrics = ops.metrics();
  SystemClock clock;
  std::mt19937_64 rng{std::random_device{}()};
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  auto jitter = [&] { return uniform(rng); };  // loop thread only

  RelayLoop loop(store, first.sinks, *first.router, clock, metrics, loop_options(config), jitter);
  // The relay's spans: only with tracing.otlp_endpoint (off, nothing is made and the loop builds
  // no span). Declared after the loop's borrowings and before the runner: it outlives the loop's
  // last batch and sends what is queued when run_relay returns (bounded by tracing.timeout).
  std::unique_ptr<tracing::OtlpExporter> exporter;
  if (config.tracing.enabled()) {
    exporter = std::make_unique<tracing::OtlpExporter>(exporter_options(config, instance_id), metrics);
    loop.trace_to(exporter.get());
  }
  Runner runner(loop, store, bell, clock, metrics, health, runner_options(config), jitter);
  Reloader reloader(source, std::move(first), runner, bell, ops);

  // A transaction pooler in database.url is a configuration error: refuse before anything runs. A
  // database that cannot be reached now is not: the runner retries (and checks at each connect).
  try {
    store.connect();
  } catch (const pg::TransactionPoolerDetected& e) {
    throw config::ConfigError(e.what());
  } catch (const pg::SchemaTooOld& e) {
    throw std::runtime_error(e.what());  // exit 1 with the migrate hint: nothing runs on an older schema
  } catch (const pg::AmbiguousTable& e) {
    throw std::runtime_error(e.what());  // exit 1: which table is the outbox is not for the relay to guess
  } catch (const StoreUnavailable&) {
  }

  pg::Listener listener(config.database.url, config.database.channel, bell, health, metrics, config.database.reconnect,
                        clock, watch_options(config));
  // A process-directed SIGHUP (raise() would direct it at this thread, where nobody takes it).
  listener.on_reload([] { kill(getpid(), SIGHUP); });
  ops.start([&store] { return store.lanes_owned(); });
  listener.start();
  std::promise<void> finished;
  auto loop_done = finished.get_future();
  std::thread loop_thread([&] {
    runner.run();
    finished.set_value();
  });

  int exit_code = 0;
  wait_for_stop(bell, signals, reloader);
  const auto deadline = std::chrono::steady_clock::now() + reloader.current().config.relay.shutdown_timeout;
  listener.interrupt();  // a watch statement in progress
  // Past the deadline: leave without the threads still waiting (nothing is lost by it).
  const auto leave_now = [&] {
    log::info("stopped", {{"exit_code", exit_code}});
    std::fflush(nullptr);
    _exit(exit_code);
  };
  if (loop_done.wait_until(deadline - std::chrono::milliseconds(500)) != std::future_status::ready) {
    // A sink is stuck past the bound: release this instance's leases from a fresh session so a
    // peer takes the rows at once, then leave without waiting for the sink.
    log::warn("batch in flight did not finish within the shutdown timeout; releasing its leases");
    pg::PgStore rescue(store_settings);
    rescue.release_leases();
    leave_now();
  }
  loop_thread.join();
  reloader.poll();  // a reload the loop took before it stopped: its sinks are the ones to flush
  for (Sink* s : reloader.current().sinks) {
    const auto left =
        std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now());
    s->flush(std::max(left, std::chrono::milliseconds{100}));
  }
  store.release_leases();
  store.disconnect();
  // The LISTEN thread ends because the bell is stopped (and its watch, if any, was cancelled).
  if (!listener.join_until(deadline)) {
    log::warn("the LISTEN session did not end within the shutdown timeout; leaving without it");
    leave_now();
  }
  ops.stop();
  log::info("stopped", {{"exit_code", exit_code}});
  return exit_code;
}

}  // namespace outbox::app
