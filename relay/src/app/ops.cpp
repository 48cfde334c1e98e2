#include "app/ops.hpp"

#include <chrono>
#include <condition_variable>
#include <mutex>
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
  for (const Sink* s : sinks) names.push_back(s->name());
  return names;
}

}  // namespace

struct Ops::Impl {
  const config::Config& config;
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
    auto r = http::evaluate_readiness(health, sinks, bell.stopped());
    metrics.ready(r.ready);
    return r;
  }

  std::string scrape() {
    readiness();  // outbox_relay_ready as of this scrape, not of the last timer tick
    if (lanes_owned) metrics.lanes_owned(lanes_owned());
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
    } while (sleep_until(std::chrono::steady_clock::now() + config.http.refresh_interval));
  }

  // relay.retention: a pass deletes batch after batch until one comes back short.
  void run_retention() {
    const auto older_than = *config.relay.retention;
    pg::RetentionSweeper sweeper(config.database.url, config.database.table);
    do {
      const auto started = std::chrono::steady_clock::now();
      long long deleted = 0;
      int batches = 0;
      try {
        while (!stopped()) {
          const std::size_t n = sweeper.delete_batch(older_than);
          if (n > 0) ++batches;
          deleted += static_cast<long long>(n);
          metrics.retention_deleted(static_cast<long long>(n));
          if (n < sweeper.batch_size()) break;
        }
      } catch (const DbError& e) {
        metrics.db_error(e.kind());
        log_db_error("retention pass failed, will try again at the next interval", e,
                     {{"deleted", deleted}, {"batches", batches}});
      }
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
      nlohmann::json fields{{"deleted", deleted}, {"batches", batches}, {"batch_size", sweeper.batch_size()},
                            {"older_than", config::format_duration(older_than)}, {"seconds", seconds}};
      if (deleted > 0) {
        log::info("retention deleted processed events", std::move(fields));
      } else {
        log::debug("retention found nothing to delete", std::move(fields));
      }
    } while (sleep_until(std::chrono::steady_clock::now() + config.relay.retention_interval));
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
