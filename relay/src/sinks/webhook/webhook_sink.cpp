#include "sinks/webhook/webhook_sink.hpp"

#include <curl/curl.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cctype>
#include <chrono>
#include <deque>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>

#include "config/duration.hpp"
#include "config/section.hpp"
#include "log/log.hpp"
#include "sinks/common/batch_log.hpp"
#include "sinks/common/c_handle.hpp"
#include "sinks/webhook/dispatch.hpp"
#include "sinks/webhook/signature.hpp"
#include "sinks/webhook/webhook_outcomes.hpp"
#include "version.hpp"

namespace outbox::sinks {
namespace {

using Steady = std::chrono::steady_clock;

using EasyPtr = CHandle<CURL, &curl_easy_cleanup>;
using MultiPtr = CHandle<CURLM, &curl_multi_cleanup>;
using SlistPtr = CHandle<curl_slist, &curl_slist_free_all>;

// curl_global_init is not safe to race with other curl calls: once per process, before any handle.
void init_curl_once() {
  static std::once_flag once;
  std::call_once(once, [] {
    if (const CURLcode rc = curl_global_init(CURL_GLOBAL_DEFAULT); rc != CURLE_OK) {
      throw std::runtime_error(std::string("curl_global_init failed: ") + curl_easy_strerror(rc));
    }
  });
}

void append(SlistPtr& list, const std::string& line) {
  curl_slist* head = curl_slist_append(list.get(), line.c_str());  // copies line
  if (!head) throw std::bad_alloc();
  (void)list.release();  // head is the old head when the list was not empty
  list.reset(head);
}

// "Name: value"; curl drops a header given as "Name:", so an empty value is written "Name;".
std::string header_line(const std::string& name, const std::string& value) {
  return value.empty() ? name + ";" : name + ": " + value;
}

std::string lower(std::string text) {
  std::transform(text.begin(), text.end(), text.begin(), [](unsigned char c) { return std::tolower(c); });
  return text;
}

std::string_view trim_line(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r' || text.back() == '\n')) {
    text.remove_suffix(1);
  }
  return text;
}

}  // namespace

namespace webhook {

struct Submission;

// One reusable request slot: an easy handle and what its current transfer needs and collects.
// Slots never move (held by unique_ptr) because curl keeps pointers to them.
struct Transfer {
  EasyPtr easy;
  SlistPtr headers;         // the current request's header list; curl borrows it
  std::string body;         // the first kMaxBodyExcerpt bytes of the response
  std::string retry_after;  // Retry-After of the final response, if any
  std::array<char, CURL_ERROR_SIZE> error{};
  std::string request;               // the request body when it is built (events_per_request > 1)
  Submission* owner = nullptr;       // while attached: the submission whose events it carries
  std::vector<std::size_t> indices;  // their indices in that submission (one unless batched)
  bool attached = false;             // added to the multi handle

  static std::size_t on_body(char* data, std::size_t size, std::size_t count, void* self) {
    auto* t = static_cast<Transfer*>(self);
    const std::size_t length = size * count;
    try {
      if (t->body.size() < kMaxBodyExcerpt) {
        t->body.append(data, std::min(length, kMaxBodyExcerpt - t->body.size()));
      }
    } catch (const std::bad_alloc&) {
      return 0;  // fails this transfer (a retry); exceptions must not cross curl's C frames
    }
    return length;  // the rest is read and dropped, so the connection stays reusable
  }

  static std::size_t on_header(char* data, std::size_t size, std::size_t count, void* self) {
    auto* t = static_cast<Transfer*>(self);
    const std::size_t length = size * count;
    const std::string_view line(data, length);
    try {
      if (line.substr(0, 5) == "HTTP/") {
        t->retry_after.clear();  // a new response begins (after a 1xx): only the final one counts
      } else if (header_has_prefix(line, "retry-after:")) {
        t->retry_after = trim_line(line.substr(12));
      }
    } catch (const std::bad_alloc&) {
      return 0;
    }
    return length;
  }
};

// One submit()'s events and what became of them, until collect() hands them back. Its requests
// share the sink's slots with the other submissions outstanding (at most two: the loop's window).
struct Submission {
  Submission(std::span<const Event* const> batch, Steady::time_point now, std::chrono::milliseconds timeout)
      : events(batch), plan(batch), results(batch.size()), started(now), deadline(now + timeout) {}
  Submission(const Submission&) = delete;  // its transfers point to it
  Submission& operator=(const Submission&) = delete;

  std::span<const Event* const> events;  // borrowed: the loop keeps them until collect() returns
  KeyedDispatch plan;                    // which of its events may start now (per-key order)
  std::vector<std::optional<Outcome>> results;
  Steady::time_point started;
  Steady::time_point deadline;  // none of its requests starts after this
  std::size_t running = 0;      // its requests attached to the multi handle
  long new_connections = 0;
  std::string stopped;  // why none of its requests starts any more (curl itself failed), or empty
  // Events of a request of several that the receiver refused (a 4xx): each goes again alone, so
  // that only the event the receiver refuses is dead-lettered. Handed out by plan, not finished.
  std::deque<std::size_t> alone;
  std::string refused;  // the answer to the last such request, for the log

  void record(std::size_t index, Outcome outcome) {
    plan.finish(index, outcome.kind == OutcomeKind::kRetry);
    results[index] = std::move(outcome);
  }

  // Whether a request of it may start now (KeyedDispatch, or an event to send alone).
  bool ready(Steady::time_point now) const {
    return (plan.ready() || !alone.empty()) && stopped.empty() && now < deadline;
  }

  // One outcome per event, once nothing of it runs: events never started are deferred (released).
  std::vector<Outcome> outcomes() {
    for (const std::size_t index : alone) {
      results[index] = Outcome{OutcomeKind::kDeferred,
                               "not sent again alone after the request of several was refused (" + refused +
                                   "): " + (stopped.empty() ? "the batch reached the sink timeout" : stopped),
                               std::nullopt};
    }
    for (const auto& unsent : plan.unsent()) {
      std::string why = unsent.blocked     ? "blocked by an earlier event of the same key"
                        : !stopped.empty() ? "not sent: " + stopped
                                           : "not sent: the batch reached the sink timeout";
      results[unsent.index] = Outcome{OutcomeKind::kDeferred, std::move(why), std::nullopt};
    }
    std::vector<Outcome> out;
    out.reserve(results.size());
    for (auto& r : results) {
      if (!r) r = Outcome::retry("internal error: the webhook sink lost track of this event");
      out.push_back(std::move(*r));
    }
    return out;
  }
};

}  // namespace webhook

using webhook::Submission;
using webhook::Transfer;

namespace {

// The curl side of the sink: the multi handle and the request slots, which live as long as the
// sink, and what every request carries.
struct Client {
  std::string name;
  WebhookSinkConfig config;
  std::vector<std::string> static_header_lines;
  std::set<std::string> static_header_names;  // lower case
  MultiPtr multi;
  std::vector<std::unique_ptr<Transfer>> transfers;  // max_in_flight slots

  ~Client() { detach_all(); }

  void detach_all() {
    for (auto& t : transfers) {
      if (t->attached) curl_multi_remove_handle(multi.get(), t->easy.get());
      t->attached = false;
      t->headers.reset();
    }
  }

  template <class T>
  void setopt(CURL* easy, CURLoption option, T value, const char* what) {
    if (const CURLcode rc = curl_easy_setopt(easy, option, value); rc != CURLE_OK) {
      throw config::ConfigError("sink '" + name + "': libcurl rejected " + what + ": " + curl_easy_strerror(rc));
    }
  }

  std::unique_ptr<Transfer> make_transfer() {
    auto t = std::make_unique<Transfer>();
    t->indices.reserve(static_cast<std::size_t>(config.events_per_request));  // take_events() never allocates
    t->easy.reset(curl_easy_init());
    if (!t->easy) throw std::runtime_error("curl_easy_init failed");
    CURL* e = t->easy.get();
    setopt(e, CURLOPT_URL, config.url.c_str(), "url");
    setopt(e, CURLOPT_PROTOCOLS_STR, "http,https", "protocols");
    setopt(e, CURLOPT_NOSIGNAL, 1L, "nosignal");  // we run on threads: no SIGALRM for DNS timeouts
    setopt(e, CURLOPT_TIMEOUT_MS, static_cast<long>(config.timeout.count()), "timeout");
    setopt(e, CURLOPT_POST, 1L, "POST");
    setopt(e, CURLOPT_FOLLOWLOCATION, 0L, "redirects");  // a redirect is an answer, not a delivery
    setopt(e, CURLOPT_TCP_KEEPALIVE, 1L, "tcp keepalive");
    setopt(e, CURLOPT_USERAGENT, (std::string("outbox-relay/") + kVersion).c_str(), "user agent");
    setopt(e, CURLOPT_WRITEFUNCTION, &Transfer::on_body, "write callback");
    setopt(e, CURLOPT_WRITEDATA, static_cast<void*>(t.get()), "write data");
    setopt(e, CURLOPT_HEADERFUNCTION, &Transfer::on_header, "header callback");
    setopt(e, CURLOPT_HEADERDATA, static_cast<void*>(t.get()), "header data");
    setopt(e, CURLOPT_ERRORBUFFER, t->error.data(), "error buffer");
    setopt(e, CURLOPT_PRIVATE, static_cast<void*>(t.get()), "private");
    if (!config.tls.ca_file.empty()) setopt(e, CURLOPT_CAINFO, config.tls.ca_file.c_str(), "tls.ca_file");
    if (config.tls.insecure_skip_verify) {
      setopt(e, CURLOPT_SSL_VERIFYPEER, 0L, "tls.insecure_skip_verify");
      setopt(e, CURLOPT_SSL_VERIFYHOST, 0L, "tls.insecure_skip_verify");
    }
    return t;
  }

  // format: json: the row's headers (the loop dropped those reserves_header names). Returns why the
  // event can never be sent, if so.
  std::optional<std::string> append_row_headers(SlistPtr& list, const Event& e) {
    for (const auto& [hname, value] : e.headers) {
      if (!is_valid_header_name(hname)) {
        return "invalid event header name '" + webhook::body_excerpt(hname, 64) + "'";
      }
      if (!is_valid_header_value(value)) {
        return "invalid value of event header '" + hname + "': it contains CR, LF or NUL";
      }
      append(list, header_line(hname, value));
    }
    return std::nullopt;
  }

  // The headers every request has: content type, Standard Webhooks' id, timestamp and signature
  // over `body`, the config's static headers.
  SlistPtr common_headers(const char* content_type, const std::string& id, std::string_view body) {
    SlistPtr list;
    append(list, std::string("Content-Type: ") + content_type);
    append(list, "Expect:");  // no 100-continue round trip for larger bodies
    const auto timestamp =
        std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch()).count();
    append(list, "webhook-id: " + id);
    append(list, "webhook-timestamp: " + std::to_string(timestamp));
    if (!config.signing_keys.empty()) {
      append(list, "webhook-signature: " + webhook::signature_header(config.signing_keys, id, timestamp, body));
    }
    for (const auto& line : static_header_lines) append(list, line);
    return list;
  }

  // Sets t's per-request state and options; curl borrows body until the request ends.
  static void arm(Transfer& t, SlistPtr list, std::string_view body) {
    CURL* easy = t.easy.get();
    t.body.clear();
    t.retry_after.clear();
    t.error[0] = '\0';
    // Per-request options cannot fail once the same options were accepted at construction.
    curl_easy_setopt(easy, CURLOPT_HTTPHEADER, list.get());
    curl_easy_setopt(easy, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(body.size()));
    curl_easy_setopt(easy, CURLOPT_POSTFIELDS, body.data());
    t.headers = std::move(list);
  }

  // Sets up t for the events of s at t.indices (events_per_request > 1): a JSON array of their
  // records as the file sink writes them (format json), or of structured CloudEvents
  // (application/cloudevents-batch+json), in the order of t.indices. Cannot fail: whatever a row
  // holds, JSON can carry it.
  void prepare_batch(Transfer& t, std::span<const Event* const> events) {
    std::vector<EventId> ids;
    ids.reserve(t.indices.size());
    t.request.clear();
    t.request += '[';
    for (const std::size_t index : t.indices) {
      if (!ids.empty()) t.request += ',';
      append_record(*events[index], config.envelope, t.request);
      ids.push_back(events[index]->id);
    }
    t.request += ']';
    const bool cloudevents = config.envelope.format == EnvelopeFormat::kCloudEvents;
    arm(t,
        common_headers(cloudevents ? "application/cloudevents-batch+json" : "application/json",
                       webhook::batch_message_id(ids), t.request),
        t.request);
  }

  // Sets up t for event e alone (events_per_request 1). Returns why the event can never be sent,
  // if so.
  std::optional<std::string> prepare(Transfer& t, const Event& e) {
    SlistPtr list = common_headers("application/json", std::to_string(e.id), e.payload);
    if (config.envelope.format == EnvelopeFormat::kCloudEvents) {
      // HTTP protocol binding, binary content mode: ce-<attribute> headers, the payload as body.
      for (const auto& [attribute, value] : cloudevents_attributes(e, config.envelope)) {
        append(list, header_line("ce-" + attribute, percent_encode_header_value(value)));
      }
    } else if (auto error = append_row_headers(list, e)) {
      return error;
    }
    arm(t, std::move(list), e.payload);  // borrowed: the event outlives publish()
    return std::nullopt;
  }
};

// The sink make_webhook_sink() builds (webhook_sink.hpp).
class WebhookSink final : public NamedSink {
 public:
  WebhookSink(std::string name, WebhookSinkConfig config);
  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    submit(events);
    return collect();
  }
  bool pipelined() const override { return true; }
  void submit(std::span<const Event* const> events) override;
  std::vector<Outcome> collect() override;
  bool usable() const override { return usable_.load(); }
  // Not a value of OpenTelemetry's list: the sink type. The destination is the sink's name, not
  // any part of its URL: Slack's, Discord's and many other webhook URLs carry their secret in the
  // path, and a query or user part may carry a token.
  const char* messaging_system() const override { return "webhook"; }
  std::string destination(const Event& /*event*/) const override { return name(); }
  // outbox-*, webhook-* (Standard Webhooks), ce-* (CloudEvents' HTTP binding, which a receiver may
  // read in either format), the framing headers, and the headers the sink's config sets.
  bool reserves_header(std::string_view name) const override {
    return is_outbox_header(name) || header_has_prefix(name, "webhook-") || header_has_prefix(name, "ce-") ||
           is_reserved_webhook_header(std::string(name)) || client_.static_header_names.count(lower(std::string(name)));
  }

 private:
  // Starts requests on the idle slots, the oldest submission's first, while one has an event that
  // may go now (KeyedDispatch) and its deadline has not passed.
  void start_requests();
  // One turn of curl: sends and reads what it can, and hands each finished request's outcome to
  // its submission. With `wait`, blocks until something happens (at most 1 s) if none finished.
  void step(bool wait);
  // A finished request: its slot back to idle_, its outcome to its submission.
  void finish(CURL* easy, CURLcode result);
  // curl itself failed (out of memory or a bug): every request attached gets a retry, and no
  // outstanding submission starts another (their unsent events are released).
  void fail_attached(const std::string& why);
  // Detaches whatever requests of `s` are still attached (after an exception); cannot throw.
  void drop(const Submission& s) noexcept;
  // Detaches an attached request and hands its slot back to idle_; cannot throw.
  void release(Transfer& t) noexcept;

  Client client_;
  std::vector<Transfer*> idle_;         // slots not attached; capacity max_in_flight
  std::deque<Submission> submissions_;  // not yet collected, oldest first
  std::atomic<bool> usable_{true};
};

}  // namespace

WebhookSink::WebhookSink(std::string name, WebhookSinkConfig config) : NamedSink(std::move(name)) {
  init_curl_once();
  client_.name = this->name();
  client_.config = std::move(config);
  for (const auto& [hname, value] : client_.config.headers) {
    client_.static_header_lines.push_back(header_line(hname, value));
    client_.static_header_names.insert(lower(hname));
  }
  client_.multi.reset(curl_multi_init());
  if (!client_.multi) throw std::runtime_error("curl_multi_init failed");
  // Keep one idle connection per possible request, so a batch after a batch opens none.
  const long slots = client_.config.max_in_flight;
  curl_multi_setopt(client_.multi.get(), CURLMOPT_MAXCONNECTS, slots);
  curl_multi_setopt(client_.multi.get(), CURLMOPT_MAX_HOST_CONNECTIONS, slots);
  for (int i = 0; i < client_.config.max_in_flight; ++i) client_.transfers.push_back(client_.make_transfer());
  idle_.reserve(client_.transfers.size());  // so that handing a slot back never allocates
  for (auto it = client_.transfers.rbegin(); it != client_.transfers.rend(); ++it) idle_.push_back(it->get());

  log::info("webhook sink ready", {{"sink", client_.name},
                                   {"url", client_.config.url_for_logs},
                                   {"max_in_flight", client_.config.max_in_flight},
                                   {"timeout", config::format_duration(client_.config.timeout)},
                                   {"signing_keys", client_.config.signing_keys.size()}});
  if (client_.config.signing_keys.empty()) {
    log::warn("webhook sink has no secrets: requests are not signed", {{"sink", client_.name}});
  }
  if (client_.config.tls.insecure_skip_verify) {
    log::warn("webhook sink does not verify TLS certificates (tls.insecure_skip_verify)", {{"sink", client_.name}});
  }
}

namespace {

// The batch's line in the log: at warn with the first error when a request failed, else at debug.
void log_webhook_batch(const std::string& name, const std::vector<Outcome>& outcomes, long new_connections,
                       Steady::time_point started) {
  const BatchSummary summary = BatchSummary::of(outcomes);
  const auto elapsed_ms = std::chrono::duration_cast<std::chrono::milliseconds>(Steady::now() - started).count();
  nlohmann::json fields{{"sink", name},
                        {"events", outcomes.size()},
                        {"delivered", summary.delivered},
                        {"retry", summary.retry},
                        {"permanent", summary.permanent},
                        {"deferred", summary.deferred},
                        {"new_connections", new_connections},
                        {"ms", elapsed_ms}};
  if (summary.first_failure) {
    fields["first_error"] = summary.first_failure->reason;
    log::warn("webhook requests failed", std::move(fields));
  } else {
    log::debug("webhook batch sent", std::move(fields));
  }
}

}  // namespace

// The events the next request of s carries, into t.indices, in id order: one sent alone after a
// refused request of several, else up to events_per_request that KeyedDispatch hands out (one per
// key: a key never has two events in flight). Empty when none may go now. Does not allocate
// (t.indices has room for events_per_request), so nothing handed out can be lost to a throw here.
void take_events(Submission& s, Transfer& t, std::size_t events_per_request) {
  t.indices.clear();
  if (!s.alone.empty()) {
    t.indices.push_back(s.alone.front());
    s.alone.pop_front();
    return;
  }
  while (t.indices.size() < events_per_request) {
    const auto index = s.plan.next();
    if (!index) break;
    t.indices.push_back(*index);
  }
  // The loop passes events in id order: the body, and so the webhook-id, name the same events
  // the same way whichever keys' requests ended first.
  std::sort(t.indices.begin(), t.indices.end());
}

// A request whose body holds more than this gives its buffer back when it ends, so a slot does not
// keep its largest body for the sink's life.
constexpr std::size_t kKeptRequestBytes = 1 << 20;

void WebhookSink::start_requests() {
  const auto now = Steady::now();
  const auto per_request = static_cast<std::size_t>(client_.config.events_per_request);
  for (Submission& s : submissions_) {
    if (!s.stopped.empty() || now >= s.deadline) continue;
    while (!idle_.empty()) {
      Transfer& t = *idle_.back();
      take_events(s, t, per_request);
      if (t.indices.empty()) break;
      try {
        if (per_request > 1) {
          client_.prepare_batch(t, s.events);
        } else if (auto invalid = client_.prepare(t, *s.events[t.indices[0]])) {
          s.record(t.indices[0], Outcome::permanent(std::move(*invalid)));
          continue;
        }
      } catch (const std::exception& e) {
        // Out of memory building the request: its events retry (and hold their keys), handed out
        // and so given their outcome here, not lost between the plan and a request.
        t.headers.reset();
        const std::string why = std::string("the request could not be built: ") + e.what();
        for (const std::size_t index : t.indices) s.record(index, Outcome::retry(why));
        continue;
      }
      if (const CURLMcode rc = curl_multi_add_handle(client_.multi.get(), t.easy.get()); rc != CURLM_OK) {
        t.headers.reset();
        const std::string why = std::string("curl_multi_add_handle: ") + curl_multi_strerror(rc);
        for (const std::size_t index : t.indices) s.record(index, Outcome::retry(why));
        continue;
      }
      t.attached = true;
      t.owner = &s;
      idle_.pop_back();
      ++s.running;
    }
    if (idle_.empty()) return;
  }
}

void WebhookSink::step(bool wait) {
  int still_running = 0;
  if (const CURLMcode rc = curl_multi_perform(client_.multi.get(), &still_running); rc != CURLM_OK) {
    fail_attached(std::string("curl_multi_perform: ") + curl_multi_strerror(rc));
    return;
  }
  bool any_done = false;
  int queued = 0;
  while (CURLMsg* msg = curl_multi_info_read(client_.multi.get(), &queued)) {
    if (msg->msg != CURLMSG_DONE) continue;
    finish(msg->easy_handle, msg->data.result);  // msg dies with remove_handle there
    any_done = true;
  }
  if (any_done || !wait) return;  // start the next requests before waiting
  if (const CURLMcode rc = curl_multi_poll(client_.multi.get(), nullptr, 0, 1000, nullptr); rc != CURLM_OK) {
    fail_attached(std::string("curl_multi_poll: ") + curl_multi_strerror(rc));
  }
}

void WebhookSink::finish(CURL* easy, CURLcode result) {
  void* self = nullptr;
  curl_easy_getinfo(easy, CURLINFO_PRIVATE, &self);
  Transfer& t = *static_cast<Transfer*>(self);
  long status = 0;
  curl_easy_getinfo(easy, CURLINFO_RESPONSE_CODE, &status);
  long connects = 0;
  curl_easy_getinfo(easy, CURLINFO_NUM_CONNECTS, &connects);
  Submission& s = *t.owner;
  release(t);  // first: whatever throws below, the slot is not lost
  --s.running;
  s.new_connections += connects;
  Outcome outcome =
      result == CURLE_OK
          ? webhook::classify_response(status, t.body,
                                       webhook::parse_retry_after(t.retry_after, std::chrono::system_clock::now()))
          : webhook::transfer_error_outcome(result, t.error[0] ? t.error.data() : curl_easy_strerror(result));
  usable_ = result == CURLE_OK;
  if (outcome.kind == OutcomeKind::kPermanent && t.indices.size() > 1) {
    // The receiver refused a request of several: which event it objects to is unknown, so each
    // goes again alone (in id order), and only the one it refuses then is dead-lettered.
    log::warn("webhook request of several events refused; each of them goes again alone",
              {{"sink", name()}, {"events", t.indices.size()}, {"error", outcome.reason}});
    s.refused = outcome.reason;
    s.alone.insert(s.alone.end(), t.indices.begin(), t.indices.end());
    return;
  }
  for (std::size_t i = 0; i + 1 < t.indices.size(); ++i) s.record(t.indices[i], outcome);
  s.record(t.indices.back(), std::move(outcome));
}

void WebhookSink::fail_attached(const std::string& why) {
  for (auto& t : client_.transfers) {
    if (!t->attached) continue;
    Submission& s = *t->owner;
    release(*t);
    --s.running;
    for (const std::size_t index : t->indices) s.record(index, Outcome::retry(why));
  }
  for (Submission& s : submissions_) s.stopped = why;
}

void WebhookSink::drop(const Submission& s) noexcept {
  for (auto& t : client_.transfers) {
    if (!t->attached || t->owner != &s) continue;
    release(*t);
  }
}

void WebhookSink::release(Transfer& t) noexcept {
  curl_multi_remove_handle(client_.multi.get(), t.easy.get());
  t.attached = false;
  t.owner = nullptr;
  t.headers.reset();
  if (t.request.capacity() > kKeptRequestBytes) std::string().swap(t.request);
  idle_.push_back(&t);  // within the capacity reserved: does not allocate
}

void WebhookSink::submit(std::span<const Event* const> events) {
  submissions_.emplace_back(events, Steady::now(), client_.config.timeout);
  try {
    start_requests();
    step(false);  // the requests go out now; collect() reads their answers
  } catch (...) {
    // The loop retries these events and forgets the submission (Sink::submit()): so does the sink.
    drop(submissions_.back());
    submissions_.pop_back();
    throw;
  }
}

std::vector<Outcome> WebhookSink::collect() {
  if (submissions_.empty()) return {};
  // Whatever happens, the oldest submission is gone after this, and none of its requests stays
  // attached (the loop takes an exception here as retries of its events).
  struct PopFront {
    WebhookSink& sink;
    ~PopFront() {
      sink.drop(sink.submissions_.front());
      sink.submissions_.pop_front();
    }
  } pop{*this};
  Submission& s = submissions_.front();
  // The later submission's requests run too: they take the slots this one leaves.
  for (;;) {
    start_requests();
    // Slots go to the oldest submission first, so it waits for one only while a later one holds
    // them all: then it waits for those to finish.
    if (s.running == 0 && !s.ready(Steady::now())) break;
    step(true);
  }
  auto outcomes = s.outcomes();
  log_webhook_batch(name(), outcomes, s.new_connections, s.started);
  return outcomes;
}

std::unique_ptr<Sink> make_webhook_sink(std::string name, WebhookSinkConfig config) {
  return std::make_unique<WebhookSink>(std::move(name), std::move(config));
}

}  // namespace outbox::sinks
