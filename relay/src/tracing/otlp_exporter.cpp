#include "tracing/otlp_exporter.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <atomic>
#include <random>
#include <stdexcept>
#include <thread>

#include "log/log.hpp"
#include "tracing/span_queue.hpp"

namespace outbox::tracing {
namespace {

template <class T, auto Free>
struct CFree {
  void operator()(T* handle) const { Free(handle); }
};
using EasyPtr = std::unique_ptr<CURL, CFree<CURL, &curl_easy_cleanup>>;
using SlistPtr = std::unique_ptr<curl_slist, CFree<curl_slist, &curl_slist_free_all>>;

constexpr std::size_t kMaxErrorBody = 200;               // of a collector's error answer, in the log
constexpr std::chrono::seconds kFailureLogInterval{60};  // a collector away: one warning a minute

std::size_t keep_some(char* data, std::size_t size, std::size_t count, void* user) {
  auto* body = static_cast<std::string*>(user);
  const std::size_t n = size * count;
  if (body->size() < kMaxErrorBody) body->append(data, std::min(n, kMaxErrorBody - body->size()));
  return n;
}

}  // namespace

struct OtlpExporter::Impl {
  Impl(ExporterOptions o, Metrics& m)
      : options(std::move(o)),
        url(traces_url(options.endpoint)),
        metrics(m),
        queue(options.queue_size, options.batch_size) {}

  const ExporterOptions options;
  const std::string url;
  Metrics& metrics;
  SpanQueue queue;
  EasyPtr easy;  // the exporter thread's only (keep-alive to the collector)
  SlistPtr header_list;
  std::mt19937_64 random{std::random_device{}()};  // the exporter thread's only
  // Failure logging, the exporter thread's only.
  bool failing = false;
  std::size_t dropped_since_log = 0;
  std::chrono::steady_clock::time_point last_log{};
  std::thread thread;  // last: started after everything above, joined in ~OtlpExporter

  // One POST of `spans`. Returns an empty string on success, else what went wrong.
  std::string post(const std::vector<SendSpan>& spans) {
    const std::string body = encode_spans(spans, options.resource, [this] { return random(); }).dump();
    std::string answer;
    CURL* h = easy.get();
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body.data());
    curl_easy_setopt(h, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &answer);
    const CURLcode rc = curl_easy_perform(h);
    if (rc != CURLE_OK) return curl_easy_strerror(rc);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 200 && status < 300) return {};
    return "HTTP " + std::to_string(status) + (answer.empty() ? "" : ": " + answer);
  }

  // Exports one batch; false when the collector did not take it (the batch is dropped, counted).
  bool export_batch(const std::vector<SendSpan>& spans) {
    const std::string error = post(spans);
    const auto now = std::chrono::steady_clock::now();
    if (error.empty()) {
      metrics.spans_exported(spans.size());
      if (failing) {
        log::info("the OTLP collector takes spans again",
                  {{"endpoint", options.endpoint}, {"dropped_since_last_warning", dropped_since_log}});
        failing = false;
        dropped_since_log = 0;
      }
      return true;
    }
    metrics.spans_dropped(SpanDrop::kExportFailed, spans.size());
    dropped_since_log += spans.size();
    if (!failing || now - last_log >= kFailureLogInterval) {
      log::warn(
          "spans not exported: the OTLP collector did not take them (dropped, never retried; events are not "
          "affected)",
          {{"endpoint", options.endpoint}, {"error", log::redact(error)}, {"dropped", dropped_since_log}});
      last_log = now;
      dropped_since_log = 0;
    }
    failing = true;
    return false;
  }

  void run() {
    std::vector<SendSpan> batch;
    while (queue.take(batch, options.export_interval)) {
      // Stopping with the collector away: the rest is dropped (the destructor counts it), so a
      // shutdown waits at most about one timeout for spans.
      if (!batch.empty() && !export_batch(batch) && queue.stopped()) break;
    }
  }
};

OtlpExporter::OtlpExporter(ExporterOptions options, Metrics& metrics)
    : impl_(std::make_unique<Impl>(std::move(options), metrics)) {
  // Thread-safe in the libcurl of bookworm (7.88) and reference-counted: the webhook sink calls it too.
  if (const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT); rc != CURLE_OK) {
    throw std::runtime_error(std::string("curl_global_init failed: ") + curl_easy_strerror(rc));
  }
  Impl& i = *impl_;
  i.easy.reset(curl_easy_init());
  if (!i.easy) throw std::runtime_error("curl_easy_init failed");
  const auto append = [&i](const std::string& line) {
    curl_slist* head = curl_slist_append(i.header_list.get(), line.c_str());
    if (head == nullptr) throw std::runtime_error("curl_slist_append failed");
    (void)i.header_list.release();
    i.header_list.reset(head);
  };
  append("Content-Type: application/json");
  for (const auto& [name, value] : i.options.headers) {
    log::add_secret(value);
    append(name + ": " + value);
  }
  CURL* h = i.easy.get();
  const long timeout_ms = static_cast<long>(i.options.timeout.count());
  curl_easy_setopt(h, CURLOPT_URL, i.url.c_str());
  curl_easy_setopt(h, CURLOPT_HTTPHEADER, i.header_list.get());
  curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);  // a thread of a multi-threaded process: no SIGALRM
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
  curl_easy_setopt(h, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, &keep_some);
  // Lifetime: the thread uses impl_ and is joined in the destructor before impl_ goes.
  i.thread = std::thread([&i] { i.run(); });
}

OtlpExporter::~OtlpExporter() {
  Impl& i = *impl_;
  i.queue.stop();
  i.thread.join();  // run() exported what was queued, up to the first failure
  std::vector<SendSpan> rest;
  std::size_t left = 0;
  while (i.queue.take(rest, std::chrono::milliseconds{0})) left += rest.size();
  if (left > 0) i.metrics.spans_dropped(SpanDrop::kExportFailed, left);
}

void OtlpExporter::submit(std::vector<SendSpan>& spans) {
  if (const std::size_t dropped = impl_->queue.push(spans)) impl_->metrics.spans_dropped(SpanDrop::kQueueFull, dropped);
}

bool OtlpExporter::root_spans() const { return impl_->options.root_spans; }

}  // namespace outbox::tracing
