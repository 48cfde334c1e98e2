#pragma once
// The operations side of `run`: Prometheus metrics, the HTTP server (/metrics, /healthz,
// /readyz), the backlog gauge timer and the retention timer. Each timer has its own thread and
// its own database session, never the loop's.
#include <functional>
#include <memory>
#include <vector>

#include "config/config.hpp"
#include "core/bell.hpp"
#include "core/health.hpp"
#include "core/metrics.hpp"
#include "core/sink.hpp"

namespace outbox::app {

class Ops {
 public:
  // Builds the metrics and, when http.enabled, binds http.listen: a bind failure throws
  // config::ConfigError naming http.listen (exit 2). Serves nothing before start().
  // Everything is borrowed and must outlive this object; `bell` is only read (stopping).
  Ops(const config::Config& config, const std::vector<Sink*>& sinks, Health& health, const Bell& bell);
  ~Ops();  // stop()
  Ops(const Ops&) = delete;
  Ops& operator=(const Ops&) = delete;

  // The loop's metrics: Prometheus, also when HTTP is off (cheap, and retention counts there).
  Metrics& metrics();

  // A reload's sinks (thread-safe): /readyz looks at these from now on, and the new ones get
  // their metric series at 0. Once this returns, no thread of Ops uses the sinks it replaced.
  void set_sinks(const std::vector<Sink*>& sinks);
  // Counts a reload of the config file: applied (ok) or refused (invalid).
  void config_reloaded(bool ok);

  // Starts serving and the timers. lanes_owned is read by the gauge timer (any thread).
  void start(std::function<int()> lanes_owned);
  // Stops the timers (a retention pass stops between batches) and the HTTP server; joins.
  // Idempotent. Call at shutdown after the loop has finished, so /readyz keeps answering 503
  // ("shutting down") while the batch in flight completes.
  void stop();

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::app
