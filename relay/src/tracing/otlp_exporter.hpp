#pragma once
// Exports the relay's spans over OTLP/HTTP (JSON) to tracing.otlp_endpoint, from one thread of its
// own. The loop only hands spans in (SpanSink::submit: a bounded queue, never waits for I/O).
// Batches of tracing.batch_size spans, or what is there every tracing.export_interval, are POSTed
// once each, bounded by tracing.timeout; a batch the collector does not take (down, slow, an error
// status) is dropped and counted, never retried: spans must not cost events, memory or time when
// the collector is away. libcurl stays inside the .cpp.
#include <chrono>
#include <cstddef>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/metrics.hpp"
#include "core/tracing.hpp"
#include "tracing/otlp_json.hpp"

namespace outbox::tracing {

// No defaults here: config::TracingConfig holds them.
struct ExporterOptions {
  std::string endpoint;                        // tracing.otlp_endpoint (traces_url() is POSTed to)
  std::map<std::string, std::string> headers;  // secret values: never logged
  std::chrono::milliseconds timeout;           // one POST, connect included
  std::size_t queue_size;
  std::size_t batch_size;
  std::chrono::milliseconds export_interval;
  bool root_spans;
  Resource resource;
};

class OtlpExporter final : public SpanSink {
 public:
  // Starts the exporter's thread; `metrics` is borrowed and must outlive this object. Registers
  // the header values as secrets (log::add_secret).
  OtlpExporter(ExporterOptions options, Metrics& metrics);
  // Stops the thread after one last export of what is queued (that stops at the first failure:
  // at most about one timeout). Spans submitted after that are dropped.
  ~OtlpExporter() override;
  OtlpExporter(const OtlpExporter&) = delete;
  OtlpExporter& operator=(const OtlpExporter&) = delete;

  void submit(std::vector<SendSpan>& spans) override;
  bool root_spans() const override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::tracing
