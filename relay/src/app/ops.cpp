#include "app/ops.hpp"

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <thread>

#include "config/duration.hpp"
#include "http/prometheus_metrics.hpp"
#include "http/readiness.hpp"
#include "http/server.hpp"
#include "log/log.hpp"
#include "postgres/admin.hpp"
#include "version.hpp"

namespace outbox::app {
namespace {

// Retention's pace (run_retention): a pause of 4 times each batch's own time keeps its session
// busy a fifth of the time at most, and still deletes ~50,000 rows a second here, 3 times the
// soak's event rate (bench/RESULTS.md, "Scale over time").
constexpr int kRetentionPause = 4;
constexpr std::chrono::minutes kRetentionLogEvery{1};

// warn for a failure a reconnect may cure; error with the hint for one that needs an operator.
void log_db_error(const char* msg, const DbError& e, nlohmann::json fields) {
  fields["error"] = e.what();
  fields["class"] = db_error_label(e.kind());
  if (!needs_operator(e.kind())) return log::warn(msg, std::move(fields));
  fields["hint"] = e.hint();
  log::error(msg, std::move(fields));
}

std::vector<std::string> sink_names(const std::vector<Sink*>& sinks) {
  std::vector<std::string> names;
  names.reserve(sinks.size());
  for (const Sink* s : sinks) names.push_back(s->name());
  return names;
}

}  // namespace

struct Ops::Impl {
  const config::Config& config;
  std::mutex sinks_mutex;  // held while readiness() reads the sinks: set_sinks() waits for it
  std::vector<const Sink*> sinks;
  Health& health;
  const Bell& bell;
  http::PrometheusMetrics metrics;
  std::unique_ptr<http::HttpServer> server;
  std::function<int()> lanes_owned;

  std::mutex mutex;
  std::condition_variable cv;
  bool stopping = false;
  std::thread gauges;
  std::thread retention;

  Impl(const config::Config& c, const std::vector<Sink*>& s, Health& h, const Bell& b)
      : config(c), sinks(s.begin(), s.end()), health(h), bell(b), metrics(sink_names(s), kVersion) {}

  // Sleeps until the deadline or stop(). Returns false once stopping.
  bool sleep_until(std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(mutex);
    cv.wait_until(lock, deadline, [&] { return stopping; });
    return !stopping;
  }
  bool stopped() {
    std::lock_guard lock(mutex);
    return stopping;
  }

  http::Readiness readiness() {
    std::unique_lock lock(sinks_mutex);
    auto r = http::evaluate_readiness(health, sinks, bell.stopped());
    lock.unlock();
    metrics.ready(r.ready);
    return r;
  }

  std::string scrape() {
    readiness();  // outbox_relay_ready as of this scrape, not of the last timer tick
    {
      std::lock_guard lock(sinks_mutex);
      for (const Sink* sink : sinks) {
        if (const auto counts = sink->transaction_counts()) metrics.transactions(sink->name(), *counts);
      }
    }
    if (lanes_owned) metrics.lanes_owned(lanes_owned());
    metrics.sequence_cache(health.sequence_cache.load());
    return metrics.scrape();
  }

  // The backlog gauges: one query per tick on the probe's own session.
  void run_gauges() {
    pg::BacklogProbe probe(config.database.url, config.database.table);
    bool failing = false;
    do {
      try {
        const auto r = probe.read();
        metrics.backlog({r.pending, r.oldest_pending_age_seconds, r.notification_queue_usage});
        if (failing) log::info("backlog gauges restored");
        failing = false;
      } catch (const DbError& e) {
        // The gauges keep their last values; /readyz and outbox_relay_ready tell the outage.
        metrics.db_error(e.kind());
        if (!failing) log_db_error("backlog gauges not refreshed", e, {});
        failing = true;
      }
      readiness();
      if (lanes_owned) metrics.lanes_owned(lanes_owned());
      metrics.sequence_cache(health.sequence_cache.load());
    } while (sleep_until(std::chrono::steady_clock::now() + config.http.refresh_interval));
  }

  // relay.retention: a pass every retention_interval deletes batch after batch until one comes
  // back short, pausing after each batch for kRetentionPause times as long as the batch took (the
  // deletes and their WAL spread out instead of reaching writers' commits as a burst: bench/soak.sh).
  // A pass that found nothing waits until the oldest processed row ages past the retention, at
  // most a quarter of the retention (5 minutes at most). One "deleted" line a minute at most.
  void run_retention() {
    using std::chrono::steady_clock;
    const auto older_than = *config.relay.retention;
    const auto interval = config.relay.retention_interval;
    const auto idle_wait = std::max<std::chrono::milliseconds>(
        interval, std::min<std::chrono::milliseconds>(older_than / 4, std::chrono::minutes{5}));
    pg::RetentionSweeper sweeper(config.database.url, config.database.table);
    long long unlogged = 0;  // deleted since the last info line, in so many batches and passes
    int unlogged_batches = 0;
    int unlogged_passes = 0;
    std::optional<steady_clock::time_point> logged;
    auto wait = interval;
    do {
      const auto started = steady_clock::now();
      long long deleted = 0;
      int batches = 0;
      wait = interval;
      try {
        sweeper.begin_pass();
        for (;;) {
          const auto batch_started = steady_clock::now();
          const std::size_t n = sweeper.delete_batch(older_than);
          if (n > 0) ++batches;
          deleted += static_cast<long long>(n);
          metrics.retention_deleted(static_cast<long long>(n));
          if (n < sweeper.batch_size()) break;
          const auto now = steady_clock::now();
          if (!sleep_until(now + kRetentionPause * (now - batch_started))) break;
        }
        if (deleted == 0) {
          const auto due = sweeper.next_due(older_than);
          wait = std::clamp(due.value_or(idle_wait), interval, idle_wait);
        }
      } catch (const DbError& e) {
        metrics.db_error(e.kind());
        log_db_error("retention pass failed, will try again at the next interval", e,
                     {{"deleted", deleted}, {"batches", batches}});
      }
      const auto ended = steady_clock::now();
      unlogged += deleted;
      unlogged_batches += batches;
      if (deleted > 0) ++unlogged_passes;
      if (unlogged > 0 && (!logged || ended - *logged >= kRetentionLogEvery)) {
        log::info("retention deleted processed events",
                  {{"deleted", unlogged},
                   {"batches", unlogged_batches},
                   {"passes", unlogged_passes},
                   {"batch_size", sweeper.batch_size()},
                   {"older_than", config::format_duration(older_than)},
                   {"last_pass_seconds", std::chrono::duration<double>(ended - started).count()}});
        logged = ended;
        unlogged = 0;
        unlogged_batches = 0;
        unlogged_passes = 0;
      } else if (deleted == 0) {
        log::debug("retention found nothing to delete", {{"older_than", config::format_duration(older_than)},
                                                         {"next_pass_in", config::format_duration(wait)}});
      }
    } while (sleep_until(steady_clock::now() + wait));
  }
};

Ops::Ops(const config::Config& config, const std::vector<Sink*>& sinks, Health& health, const Bell& bell)
    : impl_(std::make_unique<Impl>(config, sinks, health, bell)) {
  if (!config.http.enabled) return;
  auto& im = *impl_;
  http::HttpHandlers handlers{
      [&im] { return im.scrape(); },
      [&im] { return http::evaluate_liveness(im.health); },
      [&im] { return im.readiness(); },
  };
  try {
    im.server = std::make_unique<http::HttpServer>(config.http.listen, std::move(handlers));
  } catch (const http::BindError& e) {
    throw config::ConfigError(std::string("http.listen: ") + e.what() +
                              " (set http.listen to a free host:port, or http.enabled: false)");
  }
}

Ops::~Ops() { stop(); }

Metrics& Ops::metrics() { return impl_->metrics; }

void Ops::set_sinks(const std::vector<Sink*>& sinks) {
  auto& im = *impl_;
  im.metrics.add_sinks(sink_names(sinks));
  std::lock_guard lock(im.sinks_mutex);
  im.sinks.assign(sinks.begin(), sinks.end());
}

void Ops::config_reloaded(bool ok) { impl_->metrics.config_reload(ok); }

void Ops::start(std::function<int()> lanes_owned) {
  auto& im = *impl_;
  im.lanes_owned = std::move(lanes_owned);
  if (im.server) {
    im.server->start();
    im.gauges = std::thread([&im] { im.run_gauges(); });
  }
  if (im.config.relay.retention) {
    log::info("retention enabled", {{"older_than", config::format_duration(*im.config.relay.retention)},
                                    {"interval", config::format_duration(im.config.relay.retention_interval)}});
    im.retention = std::thread([&im] { im.run_retention(); });
  }
}

void Ops::stop() {
  auto& im = *impl_;
  {
    std::lock_guard lock(im.mutex);
    im.stopping = true;
  }
  im.cv.notify_all();
  if (im.retention.joinable()) im.retention.join();
  if (im.gauges.joinable()) im.gauges.join();
  if (im.server) im.server->stop();
}

}  // namespace outbox::app
