#pragma once
// The Prometheus implementation of the loop's metrics seam, plus the gauges that the relay's own
// timers feed (backlog, readiness, retention). prometheus-cpp stays inside the .cpp.
//
// Threading: every method is thread-safe. The per-event calls (delivered, retried, ...) look up
// the sink's series in a map under a shared lock (written only by the constructor and add_sinks,
// at a reload), so the loop pays one uncontended lock, a hash lookup and an atomic add per event;
// an unknown sink name falls back to the registry's own locking.
#include <memory>
#include <string>
#include <vector>

#include "core/metrics.hpp"

namespace outbox::http {

// Values read by the backlog query on its own session.
struct BacklogGauges {
  long long pending = 0;                  // processed_at and dead_lettered_at both NULL
  double oldest_pending_age_seconds = 0;  // 0 when nothing is pending
  double notification_queue_usage = 0;    // pg_notification_queue_usage(), 0..1
};

class PrometheusMetrics final : public Metrics {
 public:
  // sink_names: the configured sinks, whose series are created at 0 up front so that rate() and
  // alerts see them before the first event. "relay" (events the relay rejects itself, e.g. an
  // invalid headers column or no route) is added for the dead-letter counter.
  PrometheusMetrics(const std::vector<std::string>& sink_names, const std::string& version);
  ~PrometheusMetrics() override;
  PrometheusMetrics(const PrometheusMetrics&) = delete;
  PrometheusMetrics& operator=(const PrometheusMetrics&) = delete;

  // The loop's seam.
  void claimed(std::size_t events, double seconds) override;
  void published(const std::string& sink, std::size_t events, double seconds) override;
  void delivered(const std::string& sink, double commit_to_ack_seconds) override;
  void retried(const std::string& sink) override;
  void dead_lettered(const std::string& sink) override;
  void headers_dropped(const std::string& sink, std::size_t headers) override;
  void wakeup(WakeSource source) override;
  void reconnected() override;
  void db_error(DbErrorClass kind) override;
  void ready(bool is_ready) override;
  void lanes_owned(int count) override;
  void transactions(const std::string& sink, const TransactionCounts& counts) override;
  void writers_holding(std::size_t events, double oldest_writer_seconds) override;
  void sequence_cache(long long ids) override;
  void spans_exported(std::size_t spans) override;
  void spans_dropped(SpanDrop reason, std::size_t spans) override;

  // A reload's new sinks: their series are created at 0 (those of removed sinks stay, with their
  // last values).
  void add_sinks(const std::vector<std::string>& sink_names);
  // outbox_relay_config_reloads_total{result="ok"|"error"}.
  void config_reload(bool ok);

  // Fed by the relay's own timers.
  void backlog(const BacklogGauges& values);
  void retention_deleted(long long rows);

  // The registry in the Prometheus text exposition format (version 0.0.4).
  std::string scrape() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The label value for a wakeup source: notify | sweep | retry | startup.
const char* wake_source_label(WakeSource source);

}  // namespace outbox::http
