// The Prometheus seam: names, bounded labels and values as they appear in the exposition text.
#include <doctest/doctest.h>

#include <map>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "http/prometheus_metrics.hpp"

using namespace outbox;

namespace {

// "name{labels} value" lines of the exposition, comments dropped: series -> value text.
std::map<std::string, std::string> samples(const std::string& text) {
  std::map<std::string, std::string> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    const auto space = line.rfind(' ');
    out[line.substr(0, space)] = line.substr(space + 1);
  }
  return out;
}

}  // namespace

TEST_CASE("configured sinks start at zero, with build_info") {
  http::PrometheusMetrics m({"kafka", "audit"}, "1.2.3");
  const auto s = samples(m.scrape());
  CHECK(s.at("outbox_relay_events_published_total{sink=\"kafka\"}") == "0");
  CHECK(s.at("outbox_relay_events_published_total{sink=\"audit\"}") == "0");
  CHECK(s.at("outbox_relay_events_retried_total{sink=\"audit\"}") == "0");
  CHECK(s.at("outbox_relay_events_dead_lettered_total{sink=\"kafka\"}") == "0");
  CHECK(s.at("outbox_relay_events_dead_lettered_total{sink=\"relay\"}") == "0");
  CHECK(s.count("outbox_relay_events_published_total{sink=\"relay\"}") == 0);
  CHECK(s.at("outbox_relay_delivery_latency_seconds_count{sink=\"kafka\"}") == "0");
  CHECK(s.at("outbox_relay_build_info{version=\"1.2.3\"}") == "1");
  CHECK(s.at("outbox_relay_ready") == "0");
  CHECK(s.at("outbox_relay_pending_events") == "0");
  CHECK(s.at("outbox_relay_db_reconnects_total") == "0");
  CHECK(s.at("outbox_relay_retention_deleted_total") == "0");
  for (const char* source : {"notify", "sweep", "retry", "startup"}) {
    CHECK(s.at(std::string("outbox_relay_wakeups_total{source=\"") + source + "\"}") == "0");
  }
  for (const char* kind : {"transient", "other", "privilege", "undefined_object", "authentication", "configuration"}) {
    CHECK(s.at(std::string("outbox_relay_db_errors_total{class=\"") + kind + "\"}") == "0");
  }
}

TEST_CASE("the delivery latency histogram has a bucket at 20 ms") {
  // A p99 target of 20 ms (bench/soak.sh) is the share of events in le="0.02", not interpolated.
  http::PrometheusMetrics m({"audit"}, "0.1.0");
  m.delivered("audit", 0.019);
  m.delivered("audit", 0.021);
  const auto s = samples(m.scrape());
  CHECK(s.at("outbox_relay_delivery_latency_seconds_bucket{sink=\"audit\",le=\"0.01\"}") == "0");
  CHECK(s.at("outbox_relay_delivery_latency_seconds_bucket{sink=\"audit\",le=\"0.02\"}") == "1");
  CHECK(s.at("outbox_relay_delivery_latency_seconds_bucket{sink=\"audit\",le=\"0.025\"}") == "2");
}

TEST_CASE("the loop's calls land in the right series") {
  http::PrometheusMetrics m({"audit"}, "0.1.0");
  m.claimed(3, 0.002);
  m.published("audit", 3, 0.004);
  m.delivered("audit", 0.03);
  m.delivered("audit", 2.0);
  m.delivered("audit", -0.5);  // clock skew: observed as 0
  m.retried("audit");
  m.dead_lettered("relay");
  m.dead_lettered("audit");
  m.wakeup(WakeSource::kNotify);
  m.wakeup(WakeSource::kNotify);
  m.wakeup(WakeSource::kSweep);
  m.reconnected();
  m.db_error(DbErrorClass::kPrivilege);
  m.db_error(DbErrorClass::kPrivilege);
  m.db_error(DbErrorClass::kTransient);
  m.ready(true);
  m.lanes_owned(32);
  m.backlog({42, 12.5, 0.25});
  m.retention_deleted(5000);
  m.retention_deleted(0);
  m.retention_deleted(7);
  const auto s = samples(m.scrape());
  CHECK(s.at("outbox_relay_events_published_total{sink=\"audit\"}") == "3");
  CHECK(s.at("outbox_relay_events_retried_total{sink=\"audit\"}") == "1");
  CHECK(s.at("outbox_relay_events_dead_lettered_total{sink=\"relay\"}") == "1");
  CHECK(s.at("outbox_relay_events_dead_lettered_total{sink=\"audit\"}") == "1");
  CHECK(s.at("outbox_relay_delivery_latency_seconds_count{sink=\"audit\"}") == "3");
  CHECK(s.at("outbox_relay_delivery_latency_seconds_bucket{sink=\"audit\",le=\"0.005\"}") == "1");
  CHECK(s.at("outbox_relay_delivery_latency_seconds_bucket{sink=\"audit\",le=\"0.05\"}") == "2");
  CHECK(s.at("outbox_relay_delivery_latency_seconds_bucket{sink=\"audit\",le=\"+Inf\"}") == "3");
  CHECK(s.at("outbox_relay_publish_duration_seconds_count{sink=\"audit\"}") == "1");
  CHECK(s.at("outbox_relay_claim_duration_seconds_count") == "1");
  CHECK(s.at("outbox_relay_wakeups_total{source=\"notify\"}") == "2");
  CHECK(s.at("outbox_relay_wakeups_total{source=\"sweep\"}") == "1");
  CHECK(s.at("outbox_relay_db_reconnects_total") == "1");
  CHECK(s.at("outbox_relay_db_errors_total{class=\"privilege\"}") == "2");
  CHECK(s.at("outbox_relay_db_errors_total{class=\"transient\"}") == "1");
  CHECK(s.at("outbox_relay_db_errors_total{class=\"authentication\"}") == "0");
  CHECK(s.at("outbox_relay_ready") == "1");
  CHECK(s.at("outbox_relay_lanes_owned") == "32");
  CHECK(s.at("outbox_relay_pending_events") == "42");
  CHECK(s.at("outbox_relay_oldest_pending_age_seconds") == "12.5");
  CHECK(s.at("outbox_relay_notification_queue_usage") == "0.25");
  CHECK(s.at("outbox_relay_retention_deleted_total") == "5007");
}

TEST_CASE("a sink that was not announced still counts") {
  http::PrometheusMetrics m({}, "0.1.0");
  m.published("late", 1, 0.1);
  m.delivered("late", 0.1);
  m.retried("late");
  m.dead_lettered("late");
  const auto s = samples(m.scrape());
  CHECK(s.at("outbox_relay_events_published_total{sink=\"late\"}") == "1");
  CHECK(s.at("outbox_relay_events_retried_total{sink=\"late\"}") == "1");
  CHECK(s.at("outbox_relay_events_dead_lettered_total{sink=\"late\"}") == "1");
}

TEST_CASE("counts from several threads add up") {
  http::PrometheusMetrics m({"audit"}, "0.1.0");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        m.delivered("audit", 0.01);
        if (i % 100 == 0) (void)m.scrape();
      }
    });
  }
  for (auto& t : threads) t.join();
  const auto s = samples(m.scrape());
  CHECK(s.at("outbox_relay_events_published_total{sink=\"audit\"}") == "40000");
  CHECK(s.at("outbox_relay_delivery_latency_seconds_count{sink=\"audit\"}") == "40000");
}

TEST_CASE("a reload's new sinks start at zero while the loop counts; reloads are counted by result") {
  http::PrometheusMetrics m({"audit"}, "0.1.0");
  std::thread loop([&] {  // the loop's thread counts while the reload adds sinks
    for (int i = 0; i < 10000; ++i) m.delivered(i % 2 ? "audit" : "extra", 0.01);
  });
  m.add_sinks({"audit", "extra", "more"});
  loop.join();
  m.config_reload(true);
  m.config_reload(false);
  m.config_reload(true);
  const auto s = samples(m.scrape());
  CHECK(s.at("outbox_relay_events_published_total{sink=\"audit\"}") == "5000");
  CHECK(s.at("outbox_relay_events_published_total{sink=\"extra\"}") == "5000");
  CHECK(s.at("outbox_relay_events_published_total{sink=\"more\"}") == "0");
  CHECK(s.at("outbox_relay_events_retried_total{sink=\"more\"}") == "0");
  CHECK(s.at("outbox_relay_config_reloads_total{result=\"ok\"}") == "2");
  CHECK(s.at("outbox_relay_config_reloads_total{result=\"error\"}") == "1");
}
