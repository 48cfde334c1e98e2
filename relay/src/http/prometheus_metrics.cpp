#include "http/prometheus_metrics.hpp"

#include <prometheus/counter.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <array>
#include <mutex>
#include <shared_mutex>
#include <unordered_map>

namespace outbox::http {
namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Histogram;

constexpr const char* kRelayLabel = "relay";  // the loop's label for events no sink saw

// From a few milliseconds (a local broker) to an hour (an event that waited for retries). 0.02:
// a p99 target of 20 ms (bench/soak.sh) is read off the histogram without interpolation.
const Histogram::BucketBoundaries kLatencyBuckets{0.005, 0.01, 0.02, 0.025, 0.05, 0.1, 0.25, 0.5,  1,   2.5,
                                                  5,     10,   30,   60,    120,  300, 600,  1800, 3600};
const Histogram::BucketBoundaries kClaimBuckets{0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                                0.1,    0.25,  0.5,    1,     2.5,  5};
const Histogram::BucketBoundaries kPublishBuckets{0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                                                  0.5,   1,      2.5,   5,    10,    30,   60};

constexpr std::array kWakeSources{WakeSource::kNotify,  WakeSource::kPoll,  WakeSource::kSweep, WakeSource::kRetry,
                                  WakeSource::kStartup, WakeSource::kWatch, WakeSource::kReload};

}  // namespace

const char* wake_source_label(WakeSource source) {
  switch (source) {
    case WakeSource::kNotify: return "notify";
    case WakeSource::kPoll: return "poll";
    case WakeSource::kSweep: return "sweep";
    case WakeSource::kRetry: return "retry";
    case WakeSource::kStartup: return "startup";
    case WakeSource::kWatch: return "watch";
    case WakeSource::kReload: return "reload";
  }
  return "unknown";
}

struct PrometheusMetrics::Impl {
  struct SinkSeries {
    Counter* published = nullptr;
    Counter* retried = nullptr;
    Counter* dead_lettered = nullptr;
    Counter* headers_dropped = nullptr;
    Histogram* latency = nullptr;
    Histogram* publish = nullptr;
  };

  prometheus::Registry registry;
  Family<Counter>& published = prometheus::BuildCounter()
                                   .Name("outbox_relay_events_published_total")
                                   .Help("Events the sink acknowledged (Kafka delivery report, HTTP 2xx, fsync)")
                                   .Register(registry);
  Family<Counter>& retried = prometheus::BuildCounter()
                                 .Name("outbox_relay_events_retried_total")
                                 .Help("Event deliveries that failed and were scheduled for a retry")
                                 .Register(registry);
  Family<Counter>& dead_lettered =
      prometheus::BuildCounter()
          .Name("outbox_relay_events_dead_lettered_total")
          .Help(
              "Events given up on (permanent error or max_attempts); sink=\"relay\" when the relay rejected the "
              "event itself (invalid headers, no route)")
          .Register(registry);
  Family<Counter>& headers_dropped =
      prometheus::BuildCounter()
          .Name("outbox_relay_headers_dropped_total")
          .Help("Row headers not sent because the sink reserves their names (outbox-*, and per sink: docs/sinks.md)")
          .Register(registry);
  Family<Histogram>& latency = prometheus::BuildHistogram()
                                   .Name("outbox_relay_delivery_latency_seconds")
                                   .Help("From the event's created_at to the sink's acknowledgement")
                                   .Register(registry);
  Family<Histogram>& publish = prometheus::BuildHistogram()
                                   .Name("outbox_relay_publish_duration_seconds")
                                   .Help("Time one sink took to publish one batch")
                                   .Register(registry);
  Family<Histogram>& claim_family = prometheus::BuildHistogram()
                                        .Name("outbox_relay_claim_duration_seconds")
                                        .Help("Time of one claim statement (lease a batch of due events)")
                                        .Register(registry);
  Family<Counter>& wakeups =
      prometheus::BuildCounter()
          .Name("outbox_relay_wakeups_total")
          .Help(
              "Why the loop claimed: poll (a poll of the table found new events), notify (a "
              "NOTIFY on the channel: an operator command or an opt-in writer trigger), sweep "
              "(timer), retry (a retry fell due), startup (catch-up after (re)connecting LISTEN), watch "
              "(an idle relay's watch of the id sequence saw a new id), reload (a reloaded config to take)")
          .Register(registry);
  Counter& reconnects = prometheus::BuildCounter()
                            .Name("outbox_relay_db_reconnects_total")
                            .Help("Database sessions (work or LISTEN) restored after a loss")
                            .Register(registry)
                            .Add({});
  Family<Counter>& db_errors = prometheus::BuildCounter()
                                   .Name("outbox_relay_db_errors_total")
                                   .Help(
                                       "Failed database operations of any session, by class: transient (a "
                                       "reconnect cures it), other (unlisted code, retried), privilege, "
                                       "undefined_object, authentication, configuration (an operator has to act)")
                                   .Register(registry);
  Gauge& ready_gauge = prometheus::BuildGauge()
                           .Name("outbox_relay_ready")
                           .Help("1 while the database and LISTEN sessions are up and every sink is usable")
                           .Register(registry)
                           .Add({});
  Gauge& pending = prometheus::BuildGauge()
                       .Name("outbox_relay_pending_events")
                       .Help("Events neither delivered nor dead-lettered, whole table (refreshed on a timer)")
                       .Register(registry)
                       .Add({});
  Gauge& oldest = prometheus::BuildGauge()
                      .Name("outbox_relay_oldest_pending_age_seconds")
                      .Help("Age of the oldest pending event, 0 when none (refreshed on a timer)")
                      .Register(registry)
                      .Add({});
  Gauge& notify_queue = prometheus::BuildGauge()
                            .Name("outbox_relay_notification_queue_usage")
                            .Help("pg_notification_queue_usage(): fraction of the NOTIFY queue in use, 0..1")
                            .Register(registry)
                            .Add({});
  Gauge& lanes = prometheus::BuildGauge()
                     .Name("outbox_relay_lanes_owned")
                     .Help("Ordering lanes (of 64) this instance currently publishes")
                     .Register(registry)
                     .Add({});
  Gauge& held = prometheus::BuildGauge()
                    .Name("outbox_relay_held_events")
                    .Help(
                        "Committed events of this instance's lanes held back by an open writer transaction that "
                        "may still commit an earlier event of their lanes (counted at most once a second)")
                    .Register(registry)
                    .Add({});
  Gauge& oldest_writer = prometheus::BuildGauge()
                             .Name("outbox_relay_oldest_open_writer_seconds")
                             .Help(
                                 "Age of the oldest open writer transaction holding events back, 0 when none "
                                 "(the log and `outbox-relay status` name it)")
                             .Register(registry)
                             .Add({});
  Gauge& sequence_cache = prometheus::BuildGauge()
                              .Name("outbox_relay_sequence_cache")
                              .Help(
                                  "Ids the table's id sequence hands a session at a time (CACHE); above 1 the relay "
                                  "publishes no event past an id not yet visible (schema/010), 0 before it is read")
                              .Register(registry)
                              .Add({});
  Family<Counter>& reloads = prometheus::BuildCounter()
                                 .Name("outbox_relay_config_reloads_total")
                                 .Help(
                                     "Reloads of the config file (SIGHUP, outbox-relay reload): ok (applied), error "
                                     "(invalid: nothing changed; the log names the key and line)")
                                 .Register(registry);
  Counter* reloads_ok = nullptr;
  Counter* reloads_error = nullptr;
  Counter& spans_exported = prometheus::BuildCounter()
                                .Name("outbox_relay_spans_exported_total")
                                .Help("Spans of the relay's sends the OTLP collector accepted (tracing.otlp_endpoint)")
                                .Register(registry)
                                .Add({});
  Family<Counter>& spans_dropped =
      prometheus::BuildCounter()
          .Name("outbox_relay_spans_dropped_total")
          .Help(
              "Spans of the relay's sends not exported: queue_full (more spans than tracing.queue_size waited), "
              "export_failed (the collector was away, slow or answered an error; never retried)")
          .Register(registry);
  Counter& spans_queue_full = spans_dropped.Add({{"reason", "queue_full"}});
  Counter& spans_export_failed = spans_dropped.Add({{"reason", "export_failed"}});
  Counter& retention = prometheus::BuildCounter()
                           .Name("outbox_relay_retention_deleted_total")
                           .Help("Processed rows deleted by relay.retention")
                           .Register(registry)
                           .Add({});
  Family<Gauge>& build_info = prometheus::BuildGauge()
                                  .Name("outbox_relay_build_info")
                                  .Help("Always 1; the version is in the label")
                                  .Register(registry);
  Family<Counter>& transactions = prometheus::BuildCounter()
                                      .Name("outbox_relay_kafka_transactions_total")
                                      .Help("Kafka transactions of an exactly-once sink: committed, aborted")
                                      .Register(registry);
  Family<Counter>& fenced = prometheus::BuildCounter()
                                .Name("outbox_relay_kafka_producers_fenced_total")
                                .Help(
                                    "Times an exactly-once sink's producer was fenced by a relay that took its "
                                    "lanes over (it then publishes nothing more)")
                                .Register(registry);
  Family<Counter>& marks_read = prometheus::BuildCounter()
                                    .Name("outbox_relay_kafka_marks_read_total")
                                    .Help("Lane takeovers of an exactly-once sink that read the progress mark back")
                                    .Register(registry);
  Family<Counter>& already_committed =
      prometheus::BuildCounter()
          .Name("outbox_relay_kafka_events_already_committed_total")
          .Help("Events an exactly-once sink found in its progress mark: marked delivered without producing")
          .Register(registry);
  // The last cumulative counts each transactional sink reported (a rebuilt sink starts at 0 again).
  std::mutex transactions_mutex;
  std::unordered_map<std::string, TransactionCounts> last_transactions;
  Histogram* claim = nullptr;
  std::array<Counter*, kWakeSources.size()> wakeup_by_source{};
  std::array<Counter*, std::size(kAllDbErrorClasses)> db_error_by_class{};
  mutable std::shared_mutex sinks_mutex;
  std::unordered_map<std::string, SinkSeries> sinks;  // guarded by sinks_mutex

  SinkSeries make_series(const std::string& sink) {
    const prometheus::Labels labels{{"sink", sink}};
    return {&published.Add(labels),
            &retried.Add(labels),
            &dead_lettered.Add(labels),
            &headers_dropped.Add(labels),
            &latency.Add(labels, kLatencyBuckets),
            &publish.Add(labels, kPublishBuckets)};
  }

  // Family::Add locks and returns the existing series for known labels, so the fallback for a
  // sink that was not announced is safe from any thread.
  SinkSeries series(const std::string& sink) {
    {
      std::shared_lock lock(sinks_mutex);
      if (auto it = sinks.find(sink); it != sinks.end()) return it->second;
    }
    return make_series(sink);
  }
};

PrometheusMetrics::PrometheusMetrics(const std::vector<std::string>& sink_names, const std::string& version)
    : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  im.claim = &im.claim_family.Add({}, kClaimBuckets);
  for (std::size_t i = 0; i < kWakeSources.size(); ++i) {
    im.wakeup_by_source[i] = &im.wakeups.Add({{"source", wake_source_label(kWakeSources[i])}});
  }
  for (std::size_t i = 0; i < std::size(kAllDbErrorClasses); ++i) {
    im.db_error_by_class[i] = &im.db_errors.Add({{"class", db_error_label(kAllDbErrorClasses[i])}});
  }
  for (const auto& name : sink_names) im.sinks.emplace(name, im.make_series(name));
  if (!im.sinks.count(kRelayLabel)) {
    im.sinks.emplace(kRelayLabel, Impl::SinkSeries{nullptr, nullptr, &im.dead_lettered.Add({{"sink", kRelayLabel}}),
                                                   nullptr, nullptr, nullptr});
  }
  im.reloads_ok = &im.reloads.Add({{"result", "ok"}});
  im.reloads_error = &im.reloads.Add({{"result", "error"}});
  im.build_info.Add({{"version", version}}).Set(1);
}

void PrometheusMetrics::add_sinks(const std::vector<std::string>& sink_names) {
  auto& im = *impl_;
  std::unique_lock lock(im.sinks_mutex);
  for (const auto& name : sink_names) {
    if (!im.sinks.count(name) || !im.sinks[name].published) im.sinks[name] = im.make_series(name);
  }
}

void PrometheusMetrics::config_reload(bool ok) { (ok ? impl_->reloads_ok : impl_->reloads_error)->Increment(); }

PrometheusMetrics::~PrometheusMetrics() = default;

void PrometheusMetrics::claimed(std::size_t /*events*/, double seconds) { impl_->claim->Observe(seconds); }

void PrometheusMetrics::published(const std::string& sink, std::size_t /*events*/, double seconds) {
  auto s = impl_->series(sink);
  if (!s.publish) s = impl_->make_series(sink);
  s.publish->Observe(seconds);
}

void PrometheusMetrics::delivered(const std::string& sink, double commit_to_ack_seconds) {
  auto s = impl_->series(sink);
  if (!s.published) s = impl_->make_series(sink);
  s.published->Increment();
  // Clocks of the database and this host may disagree by a little: never observe a negative.
  s.latency->Observe(std::max(0.0, commit_to_ack_seconds));
}

void PrometheusMetrics::retried(const std::string& sink) {
  auto s = impl_->series(sink);
  if (!s.retried) s = impl_->make_series(sink);
  s.retried->Increment();
}

void PrometheusMetrics::dead_lettered(const std::string& sink) { impl_->series(sink).dead_lettered->Increment(); }

void PrometheusMetrics::headers_dropped(const std::string& sink, std::size_t headers) {
  auto s = impl_->series(sink);
  if (!s.headers_dropped) s = impl_->make_series(sink);
  s.headers_dropped->Increment(static_cast<double>(headers));
}

void PrometheusMetrics::wakeup(WakeSource source) {
  for (std::size_t i = 0; i < kWakeSources.size(); ++i) {
    if (kWakeSources[i] == source) impl_->wakeup_by_source[i]->Increment();
  }
}

void PrometheusMetrics::reconnected() { impl_->reconnects.Increment(); }

void PrometheusMetrics::db_error(DbErrorClass kind) {
  for (std::size_t i = 0; i < std::size(kAllDbErrorClasses); ++i) {
    if (kAllDbErrorClasses[i] == kind) impl_->db_error_by_class[i]->Increment();
  }
}

void PrometheusMetrics::ready(bool is_ready) { impl_->ready_gauge.Set(is_ready ? 1 : 0); }

void PrometheusMetrics::lanes_owned(int count) { impl_->lanes.Set(count); }

void PrometheusMetrics::transactions(const std::string& sink, const TransactionCounts& counts) {
  auto& im = *impl_;
  std::lock_guard lock(im.transactions_mutex);
  TransactionCounts& last = im.last_transactions[sink];
  // Counters only go up: add what grew since the last report; a count below it is a new sink's.
  const auto add = [](Counter& counter, std::uint64_t value, std::uint64_t before) {
    counter.Increment(static_cast<double>(value >= before ? value - before : value));
  };
  add(im.transactions.Add({{"sink", sink}, {"outcome", "committed"}}), counts.committed, last.committed);
  add(im.transactions.Add({{"sink", sink}, {"outcome", "aborted"}}), counts.aborted, last.aborted);
  add(im.fenced.Add({{"sink", sink}}), counts.fenced, last.fenced);
  add(im.marks_read.Add({{"sink", sink}}), counts.marks_read, last.marks_read);
  add(im.already_committed.Add({{"sink", sink}}), counts.already_committed, last.already_committed);
  last = counts;
}

void PrometheusMetrics::writers_holding(std::size_t events, double oldest_writer_seconds) {
  impl_->held.Set(static_cast<double>(events));
  impl_->oldest_writer.Set(oldest_writer_seconds);
}

void PrometheusMetrics::sequence_cache(long long ids) { impl_->sequence_cache.Set(static_cast<double>(ids)); }

void PrometheusMetrics::spans_exported(std::size_t spans) {
  impl_->spans_exported.Increment(static_cast<double>(spans));
}

void PrometheusMetrics::spans_dropped(SpanDrop reason, std::size_t spans) {
  switch (reason) {
    case SpanDrop::kQueueFull: impl_->spans_queue_full.Increment(static_cast<double>(spans)); return;
    case SpanDrop::kExportFailed: impl_->spans_export_failed.Increment(static_cast<double>(spans)); return;
  }
}

void PrometheusMetrics::backlog(const BacklogGauges& values) {
  impl_->pending.Set(static_cast<double>(values.pending));
  impl_->oldest.Set(values.oldest_pending_age_seconds);
  impl_->notify_queue.Set(values.notification_queue_usage);
}

void PrometheusMetrics::retention_deleted(long long rows) {
  if (rows > 0) impl_->retention.Increment(static_cast<double>(rows));
}

std::string PrometheusMetrics::scrape() const {
  return prometheus::TextSerializer{}.Serialize(impl_->registry.Collect());
}

}  // namespace outbox::http
