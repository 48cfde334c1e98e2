#pragma once
// The sink seam: a batch in, one outcome per event out.
#include <algorithm>
#include <chrono>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/event.hpp"
#include "core/metrics.hpp"
#include "core/store.hpp"

namespace outbox {

enum class OutcomeKind {
  kDelivered,  // the downstream acknowledged (Kafka delivery report, HTTP 2xx, fsync)
  kRetry,      // try again after backoff (or after retry_after, capped by the backoff max)
  kPermanent,  // will never succeed: dead-letter with reason
  kDeferred,   // not attempted, because an earlier event of the same key failed in this batch
};

struct Outcome {
  OutcomeKind kind = OutcomeKind::kRetry;
  std::string reason;  // for kRetry/kPermanent: what went wrong, stored in last_error
  std::optional<std::chrono::milliseconds> retry_after;

  static Outcome delivered() { return {OutcomeKind::kDelivered, {}, std::nullopt}; }
  static Outcome retry(std::string why, std::optional<std::chrono::milliseconds> after = std::nullopt) {
    return {OutcomeKind::kRetry, std::move(why), after};
  }
  static Outcome permanent(std::string why) { return {OutcomeKind::kPermanent, std::move(why), std::nullopt}; }
  // Back to the table without costing an attempt (a release).
  static Outcome deferred(std::string why = "blocked by an earlier event of the same key") {
    return {OutcomeKind::kDeferred, std::move(why), std::nullopt};
  }
};

const char* to_string(OutcomeKind kind);

// Whether header `name` starts with `prefix`, ignoring ASCII case (`prefix` in lower case).
bool header_has_prefix(std::string_view name, std::string_view prefix);
// The names every sink reserves: outbox-* (the relay's own headers: outbox-id, which consumers
// de-duplicate on, outbox-topic, outbox-key, outbox-created-at).
bool is_outbox_header(std::string_view name);
// Headers as a JSON object of strings, compact ("{}" when there are none).
std::string headers_to_json(const std::vector<Header>& headers);

// A destination for events. publish() blocks until every event has an outcome; it never throws
// for downstream failures (those are outcomes). Events arrive in id order. Per-key order is the
// sink's duty within a batch: once an event of key K gets kRetry, the later events of K in the
// same batch must not be delivered (report them kDeferred, or kRetry if they were tried).
// publish() is called from one thread at a time, not always the same one (the loop publishes on
// a helper thread while it completes the previous batch); flush() after the loop has stopped.
class Sink {
 public:
  virtual ~Sink() = default;
  virtual const std::string& name() const = 0;
  virtual std::vector<Outcome> publish(std::span<const Event* const> events) = 0;

  // --- Pipelined publishing (opt in: pipelined() true; docs/design.md, "Pipelined sinks") ---
  // The loop's drain then hands the sink the next batch while the previous batch's acknowledgements
  // are outstanding: submit() sends events (id order) and returns without waiting for them;
  // collect() waits for the oldest submission not yet collected and returns one outcome per event
  // of it, in its order (bounded by the sink's timeout from its submit(); a submission the sink
  // could not send gets retries). Neither throws for downstream failures. Called from one thread
  // at a time. The loop keeps at most two batches in a sink, and never submits an event while an
  // earlier event of its key is uncollected (core/key_holds.hpp, events_behind()), so a sink needs
  // to keep order only within one submission, as publish() does. `events` stay alive until their
  // collect() returns. publish() is not called while submissions are outstanding.
  // The defaults publish at submit() and hand back the outcomes at collect(): today's behaviour; the
  // loop pipelines only when every sink of the drain says pipelined().
  virtual bool pipelined() const { return false; }
  virtual void submit(std::span<const Event* const> events) { submitted_.push_back(publish(events)); }
  virtual std::vector<Outcome> collect() {
    if (submitted_.empty()) return {};
    auto outcomes = std::move(submitted_.front());
    submitted_.erase(submitted_.begin());
    return outcomes;
  }
  // Whether the sink can currently accept events (for /readyz). Cheap, thread-safe.
  virtual bool usable() const { return true; }
  // Push out anything buffered; called at shutdown. Bounded by timeout.
  virtual void flush(std::chrono::milliseconds /*timeout*/) {}
  // Whether a row's header of this name must not reach this sink's downstream: a name the sink
  // sets itself, or one its broker acts on (docs/sinks.md, "Reserved headers"). Any case. The
  // loop drops such headers before publish(), warns and counts them; a sink may rely on it.
  virtual bool reserves_header(std::string_view name) const { return is_outbox_header(name); }
  // For the relay's spans (core/tracing.hpp), read only while tracing is on: OpenTelemetry's
  // messaging.system (its value where the semantic conventions list one, else the sink type; a
  // static string), and messaging.destination.name of an event: where this sink sends it (the
  // rendered topic, subject, exchange or stream; a webhook sink's name: its URL may carry a secret). Default: the row's
  // topic.
  virtual const char* messaging_system() const { return "outbox-relay"; }
  virtual std::string destination(const Event& event) const { return event.topic; }

  // --- Lane takeover: only sinks that keep per-lane progress downstream (Kafka exactly once) ---
  // How the lanes must be divided among relays for this sink (Store: PgStoreOptions::lane_groups):
  // 0 = any way; G = in whole groups of lanes (lane % G).
  virtual int lane_groups() const { return 0; }
  // Whether the sink owns lanes but must take over before it publishes again (a new sink, or one
  // fenced or failed fatally). The runner then rebalances and calls take_over(). Cheap, loop thread.
  virtual bool wants_takeover() const { return false; }
  // Called by the runner right after each successful Store::rebalance(), with nothing claimed and
  // nothing in flight: lanes_owned is how many lanes the instance owns now, gained whether it just
  // gained some. A sink that must, fences earlier holders of its lanes' downstream progress and
  // reads it back. Returns the ids the downstream already holds whose outcome the store may not
  // have (the runner asks the store which are still pending and hands those to keep_pending()).
  // Blocks (bounded by the sink's own timeouts); never throws for downstream failures: it then
  // still wants_takeover() and publish() retries every event.
  virtual std::vector<EventId> take_over(int /*lanes_owned*/, bool /*gained*/) { return {}; }
  // Before each take_over(): Store::identity(), which a sink that keeps progress downstream writes
  // beside it and checks when it reads it back (two tables must never share one progress).
  virtual void store_identity(const std::string& /*identity*/) {}
  // Where such a sink keeps that progress (Kafka: the transactional id and the progress topic);
  // empty for the others. A reload must not change it (app/reload.cpp).
  virtual std::string progress_location() const { return {}; }
  virtual void keep_pending(std::span<const EventId> /*still_pending*/) {}
  // The loop wrote these outcomes to the store (loop thread; publish() may run beside it).
  virtual void outcomes_written(std::span<const Completion> /*completions*/) {}
  // A transactional sink's counts; nullopt for the others. Thread-safe, lock-free.
  virtual std::optional<TransactionCounts> transaction_counts() const { return std::nullopt; }

 private:
  std::vector<std::vector<Outcome>> submitted_;  // the default submit()'s outcomes, oldest first
};

// The lane grouping a set of sinks needs: the largest any asks for (0: none).
inline int lane_groups_of(std::span<Sink* const> sinks) {
  int groups = 0;
  for (const Sink* s : sinks) groups = std::max(groups, s->lane_groups());
  return groups;
}

// The progress locations of a set of sinks (Sink::progress_location), sorted, empty ones left out.
inline std::vector<std::string> progress_locations_of(std::span<Sink* const> sinks) {
  std::vector<std::string> out;
  for (const Sink* s : sinks) {
    if (auto where = s->progress_location(); !where.empty()) out.push_back(std::move(where));
  }
  std::sort(out.begin(), out.end());
  return out;
}

// What every sink shares: the name it was configured under, set once. A sink owns connections,
// files or threads and is held by pointer, so none is copyable or movable; that is said here once.
class NamedSink : public Sink {
 public:
  NamedSink(const NamedSink&) = delete;
  NamedSink& operator=(const NamedSink&) = delete;
  const std::string& name() const final { return name_; }

 protected:
  explicit NamedSink(std::string name) : name_(std::move(name)) {}

 private:
  const std::string name_;
};

}  // namespace outbox
