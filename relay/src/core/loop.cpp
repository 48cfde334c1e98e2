#include "core/loop.hpp"

#include <algorithm>
#include <cctype>
#include <deque>
#include <exception>
#include <functional>
#include <nlohmann/json.hpp>
#include <utility>

#include "log/log.hpp"

namespace outbox {
namespace {

constexpr std::size_t kMaxTrackedRetries = 100000;
constexpr std::size_t kMaxWarnedHeaders = 64;  // (sink, header name) pairs warned about once each
constexpr const char* kNoSink = "relay";       // metric label when the relay itself rejects an event

// Moves every outcome of `from` to the end of `to`.
void move_all(std::vector<Completion>& from, std::vector<Completion>& to) {
  to.insert(to.end(), std::make_move_iterator(from.begin()), std::make_move_iterator(from.end()));
  from.clear();
}

double seconds_between(Clock::SteadyTime from, Clock::SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

std::string describe(const std::exception_ptr& failure) {
  try {
    std::rethrow_exception(failure);
  } catch (const std::exception& e) {
    return e.what();
  } catch (...) {
    return "an exception that is not a std::exception";
  }
}

// Inside a catch: the outcomes of a sink call that threw (a sink bug or a library's surprise).
std::vector<Outcome> sink_threw(const Sink& sink, std::size_t events) {
  const std::string why = "publish threw: " + describe(std::current_exception());
  log::error("sink threw; its events of this batch will be retried",
             {{"sink", sink.name()}, {"events", events}, {"error", why}});
  return std::vector<Outcome>(events, Outcome::retry(why));
}

// What an event weighs in the byte window: payload, key, topic and headers.
std::size_t event_bytes(const Event& event) {
  return event.payload.size() + event.key.size() + event.topic.size() + event.headers_json.size();
}

}  // namespace

const char* to_string(OutcomeKind kind) {
  switch (kind) {
    case OutcomeKind::kDelivered: return "delivered";
    case OutcomeKind::kRetry: return "retry";
    case OutcomeKind::kPermanent: return "permanent";
    case OutcomeKind::kDeferred: return "deferred";
  }
  return "unknown";
}

bool header_has_prefix(std::string_view name, std::string_view prefix) {
  if (name.size() < prefix.size()) return false;
  return std::equal(prefix.begin(), prefix.end(), name.begin(),
                    [](char p, char n) { return p == static_cast<char>(std::tolower(static_cast<unsigned char>(n))); });
}

bool is_outbox_header(std::string_view name) { return header_has_prefix(name, "outbox-"); }

std::string headers_to_json(const std::vector<Header>& headers) {
  if (headers.empty()) return "{}";
  nlohmann::json object = nlohmann::json::object();
  for (const auto& [name, value] : headers) object[name] = value;
  return object.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::optional<std::string> parse_headers(const std::string& json, std::vector<Header>& out) {
  out.clear();
  if (json.empty() || json == "{}") return std::nullopt;
  const auto parsed = nlohmann::json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (!parsed.is_object()) return "headers must be a JSON object of strings";
  for (const auto& [name, value] : parsed.items()) {
    if (!value.is_string()) return "header '" + name + "' must be a string, got " + value.type_name();
    out.emplace_back(name, value.get<std::string>());
  }
  return std::nullopt;
}

RelayLoop::RelayLoop(Store& store, std::vector<Sink*> sinks, const Router& router, const Clock& clock, Metrics& metrics,
                     LoopOptions options, std::function<double()> jitter01)
    : store_(store),
      sinks_(std::move(sinks)),
      router_(&router),
      clock_(clock),
      metrics_(metrics),
      options_(options),
      jitter01_(std::move(jitter01)) {
  store_.limit_claim_bytes(options_.in_flight_bytes);
}

std::optional<Clock::SteadyTime> RelayLoop::next_retry_due() const {
  if (retry_due_.empty()) return std::nullopt;
  return *retry_due_.begin();
}

void RelayLoop::reconfigure(std::vector<Sink*> sinks, const Router& router, LoopOptions options) {
  sinks_ = std::move(sinks);
  router_ = &router;
  options_ = options;
  store_.limit_claim_bytes(options_.in_flight_bytes);
}

void RelayLoop::flush_pending() {
  take_delayed();
  write_pending();
}

void RelayLoop::take_delayed() { move_all(delayed_outcomes_, pending_); }

void RelayLoop::write_pending() {
  if (pending_.empty()) return;
  store_.complete(pending_);  // throws StoreUnavailable: pending_ stays for the next try
  note_written(pending_);
  pending_.clear();
}

void RelayLoop::note_written(const std::vector<Completion>& completed) {
  // Sinks that keep what they delivered downstream until the store has it (Kafka exactly once).
  for (Sink* sink : sinks_) sink->outcomes_written(completed);
  // The store computes next_attempt_at from its own clock during complete(); counting the delay
  // from now, after it returned (plus a little slack), never wakes the runner before the row
  // is due, which would find nothing to claim and forget the wakeup.
  const auto now = clock_.now();
  for (const auto& c : completed) {
    if (c.kind == Completion::Kind::kRetry && retry_due_.size() < kMaxTrackedRetries) {
      retry_due_.insert(now + c.delay + kRetrySlack);
    }
  }
}

// One claimed batch on its way through the sinks. Not copyable: per_sink points into events (a
// move keeps the vector's elements where they are).
struct RelayLoop::Batch {
  Batch() = default;
  Batch(Batch&&) = default;
  Batch& operator=(Batch&&) = default;
  Batch(const Batch&) = delete;
  Batch& operator=(const Batch&) = delete;

  // What the sinks said about one event, merged.
  struct Verdict {
    std::vector<std::string> done;
    std::string permanent;     // first permanent reason, prefixed with the sink name
    std::string retry_reason;  // first retry reason, prefixed with the sink name
    const std::string* failed_sink = nullptr;
    std::optional<std::chrono::milliseconds> retry_after;
    bool retry = false;
    bool deferred = false;
  };
  std::vector<Event> events;
  std::size_t bytes = 0;  // of the events the sinks get: payload, key, topic and headers (the byte window)
  std::vector<Verdict> verdicts;
  std::vector<std::vector<const Event*>> per_sink;       // what each sink gets
  std::deque<Event> stripped;                            // copies without a sink's reserved headers
  std::vector<std::vector<std::size_t>> per_sink_index;  // its positions in events
  // Pipelined sinks: what was submitted and not yet collected, in submission order.
  struct Submission {
    std::size_t sink = 0;
    std::vector<const Event*> events;
    std::vector<std::size_t> index;  // their positions in events
    Clock::SteadyTime started{};
  };
  std::vector<Submission> submissions;
};

BatchResult& BatchResult::operator+=(const BatchResult& other) {
  claimed += other.claimed;
  delivered += other.delivered;
  retried += other.retried;
  dead_lettered += other.dead_lettered;
  released += other.released;
  return *this;
}

std::vector<Event> RelayLoop::claim(bool probe, long long floor) {
  const auto now = clock_.now();
  std::vector<Event> events;
  if (probe && must_carry()) {
    // The poll writes the outcomes left by earlier polls first, in its own round trip: a retry
    // (or a dead letter, a release) must be written before the claim, whose head-of-line rule
    // holds back the later events of its key.
    take_delayed();
    if (durable_outcomes()) {
      // A claim writes its outcomes with synchronous_commit off; a sink that trims what it keeps
      // downstream once an outcome is written (Kafka exactly once) needs them to survive a crash
      // of Postgres: written first, durably (Store::complete), in a round trip of their own.
      write_pending();
      events = store_.probe_claim(options_.batch_size, {});
    } else {
      events = store_.probe_claim(options_.batch_size, pending_);  // throws: pending_ stays
      note_written(pending_);
      pending_.clear();
    }
  } else if (probe) {
    // Delivered outcomes only. They wait, unmarked, until the oldest was left outcome_delay ago or
    // batch_size of them pile up; no poll claims those rows again (polls look above every id
    // claimed before), and a full claim writes them first. Then they are written beside this
    // poll's publishing, on the store's second session (drain), off the claim's path.
    if (delayed_outcomes_.empty()) delayed_since_ = now;
    move_all(pending_, delayed_outcomes_);
    if (delayed_outcomes_.size() >= options_.batch_size || now - delayed_since_ >= options_.outcome_delay) {
      pending_ = std::exchange(delayed_outcomes_, {});
    }
    events = store_.probe_claim(options_.batch_size, {});
  } else {
    events = floor > 0 ? store_.claim_above(options_.batch_size, floor) : store_.claim(options_.batch_size);
    retry_due_.erase(retry_due_.begin(), retry_due_.upper_bound(now));  // a poll may skip due retries
  }
  metrics_.claimed(events.size(), seconds_between(now, clock_.now()));
  if (spans_ != nullptr) [[unlikely]] {
    const auto claimed_us = clock_.wall_us();  // a span starts at its event's claim
    for (Event& e : events) e.claimed_at_us = claimed_us;
  }
  return events;
}

std::optional<EventId> RelayLoop::lowest_unwritten() const {
  std::optional<EventId> lowest;
  for (const auto* outcomes : {&pending_, &delayed_outcomes_}) {
    for (const Completion& c : *outcomes) {
      if (!lowest || c.id < *lowest) lowest = c.id;
    }
  }
  return lowest;
}

bool RelayLoop::durable_outcomes() const { return lane_groups_of(sinks_) > 0; }

bool RelayLoop::must_carry() const {
  if (options_.outcome_delay <= std::chrono::milliseconds::zero()) return true;
  return std::any_of(pending_.begin(), pending_.end(),
                     [](const Completion& c) { return c.kind != Completion::Kind::kDelivered; });
}

BatchResult RelayLoop::run_once() {
  flush_pending();
  BatchResult result;
  auto events = claim();
  if (events.empty()) return result;
  Batch batch = prepare(std::move(events), {});
  publish(batch);
  KeyHolds failed;
  pending_ = settle(batch, result, failed);
  flush_pending();
  return result;
}

void RelayLoop::hand_back(std::vector<Event>& events) {
  for (const Event& e : events) {
    pending_.push_back(Completion{e.id, Completion::Kind::kRelease, {}, {}, e.sinks_done, e.created_at_us});
  }
  events.clear();
}

BatchResult RelayLoop::drain(const DrainControl& control) {
  BatchResult total;
  if (!control.probe) flush_pending();
  std::vector<Event> next = claim(control.probe);
  // Outcomes a poll found due (claim) are written beside its publishing; with nothing to publish,
  // now.
  if (next.empty()) write_pending();
  bool leased = !control.probe;  // a poll's events may carry no lease (Store::probe_claim)
  bool all_delivered = true;     // every batch of this drain so far: claims ahead may start above it
  // A batch released events, and no claim from the start has looked since they were written: a
  // claim ahead ran while they were still leased to this relay, and its bounds passed them.
  bool released = false;
  // Pipelined sinks (every sink of the drain says Sink::pipelined()): the batch before, still in
  // the sinks while this one enters them and the next is claimed; its outcomes are collected and
  // settled in this batch's turn (publish_pipelined). Empty otherwise, and whenever the loop
  // leaves drain(), pauses or has nothing claimed ahead.
  std::optional<Batch> in_flight;
  while (!next.empty()) {
    const bool full = next.size() >= options_.batch_size;
    Batch batch = prepare(std::move(next), pipeline_.held());
    next.clear();
    // Three things at once: the sinks work on this batch, the previous batch's outcomes are
    // written (the store's second session), and the next batch is claimed ahead (this thread).
    // A short batch (a steady stream, polled every few milliseconds) has nothing to overlap with:
    // it is published on this thread.
    std::vector<Completion> previous = std::exchange(pending_, {});
    std::function<void()> complete_previous;
    if (!previous.empty()) complete_previous = [this, &previous] { store_.complete(previous); };
    // Not beside a poll's batch: a claim now could hand its events out again.
    const bool ahead = full && leased && !control.stop() && !control.pause_due();
    // With pipelined sinks this batch stays in them (its outcomes uncollected) while a next one
    // is claimed; only then is there a batch to follow it.
    bool leave = ahead && all_pipelined() && !over_window(batch);
    Batch* before = in_flight ? &*in_flight : nullptr;
    std::function<void()> publish_work = [this, &batch] { publish(batch); };
    if (before || leave) publish_work = [this, &batch, before, leave] { publish_pipelined(batch, before, leave); };
    pipeline_.start(std::move(publish_work), full, std::move(complete_previous));
    std::exception_ptr failure;
    try {
      if (ahead) next = claim(false, all_delivered ? batch.events.back().id : 0);  // claims come in id order
    } catch (...) {
      failure = std::current_exception();
    }

    const auto collected = pipeline_.collect();
    if (collected.publish_failure) {
      publish_failed(before, batch, collected.publish_failure);
      leave = false;
    }
    const bool previous_written = !collected.complete_failure;
    if (previous_written) {
      note_written(previous);
    } else if (!failure) {
      failure = collected.complete_failure;
    }
    const bool stopping = control.stop();
    if (leave && (failure || stopping || next.empty())) {
      collect(batch);  // nothing follows it: its outcomes now, on this thread
      leave = false;
    }
    BatchResult result;
    KeyHolds failed;
    auto outcomes = settle_turn(in_flight, batch, leave, result, failed);
    total += result;
    all_delivered = all_delivered && result.retried + result.dead_lettered + result.released == 0;
    released = released || result.released > 0;

    if (failure) {
      // Keep every outcome for the next call; hand back what was claimed meanwhile.
      if (!previous_written) pending_ = std::move(previous);
      move_all(outcomes, pending_);
      hand_back(next);
      std::rethrow_exception(failure);
    }
    pending_ = std::move(outcomes);
    if (stopping) hand_back(next);  // a stop came while this batch was in the sinks
    // The batch just claimed ahead did not see the outcomes settled here (nor those written beside
    // its claim); those of the batch left in the sinks are applied by publish_pipelined().
    if (ahead && !next.empty()) pipeline_.claimed_ahead(std::move(failed));
    if (in_flight) continue;  // next is not empty: the batch in the sinks is collected in its turn
    if (next.empty()) {
      // Nothing claimed while the sinks worked: the batch was short (caught up), or a stop or a
      // pause came, or the claim ahead found nothing. Complete it, then look again only if there
      // may be more: a full batch not yet followed by a claim, or released events, which are
      // claimable again at once. A poll that ends here leaves its outcomes to the next poll,
      // which writes them in its own round trip (has_pending() tells the runner).
      // A retry a poll took (one another instance left due, or one due before its own claim
      // came): the poll held back the later events of its key, and the next poll looks above
      // every id this one claimed, so they would be passed by later events of their key. Claim
      // from the start at once, after this batch's outcomes are written.
      // A retry any claim of a poll's drain took (also the claim from the start after a release)
      // is written now, not left for outcome_delay: until its outcome is written, a poll's
      // head-of-line rule sees it failed and pending and holds back its key's later events while
      // the poll's bounds move past them; once written, polls would take the key's events above
      // those bounds first (found by tests/fuzz: seed 1978975820, 2838 before 2759).
      const bool took_retry =
          std::any_of(batch.events.begin(), batch.events.end(), [](const Event& e) { return e.attempts > 0; });
      const bool retry_polled = !leased && took_retry;
      const bool more = (full && !ahead) || released || retry_polled;
      if (!control.probe || more || took_retry || control.stop() || control.pause_due()) flush_pending();
      pipeline_.caught_up();
      if (control.stop()) break;
      const bool paused = control.pause_due();
      if (paused) control.pause();
      if (more) {
        // After a full poll (no claim ahead beside it: its rows carry no lease), the events that
        // follow are above its last id: claim from there, as a claim ahead would, and as the next
        // poll would have. A claim from the start walks the pending index through the entries of
        // every row delivered since the last vacuum (100-400 ms at a steady 16,600 events/s), and
        // every event arriving meanwhile waits: a stall of a few tens of milliseconds (a poll
        // finding 500 events) grew into one of hundreds. From the start after a release (the
        // released events are below), lanes gained (pause) or a batch not all delivered.
        const bool above = !leased && !paused && all_delivered && !released && !retry_polled;
        next = above ? claim(false, batch.events.back().id) : claim();
        if (!above) released = false;  // a claim from the start, after their release was written
        leased = true;
      }
    }
  }
  return total;
}

void RelayLoop::publish_failed(Batch* before, Batch& batch, const std::exception_ptr& failure) {
  // Not a sink's failure (those are outcomes). What the sinks still hold is collected, so that none
  // is left with a submission of this drain.
  if (before) collect(*before);
  collect(batch);
  if (before) retry_unsettled(*before, describe(failure));
  retry_unsettled(batch, describe(failure));
}

std::vector<Completion> RelayLoop::settle_turn(std::optional<Batch>& in_flight, Batch& batch, bool leave,
                                               BatchResult& result, KeyHolds& failed) {
  std::vector<Completion> outcomes;
  if (in_flight) {
    outcomes = settle(*in_flight, result, failed);
    in_flight.reset();
  }
  if (leave) {
    in_flight.emplace(std::move(batch));
  } else {
    auto settled = settle(batch, result, failed);
    move_all(settled, outcomes);
  }
  return outcomes;
}

RelayLoop::Batch RelayLoop::prepare(std::vector<Event> events, const KeyHolds& held) const {
  Batch batch;
  batch.events = std::move(events);
  batch.verdicts.resize(batch.events.size());
  batch.per_sink.resize(sinks_.size());
  batch.per_sink_index.resize(sinks_.size());
  for (std::size_t i = 0; i < batch.events.size(); ++i) {
    Event& event = batch.events[i];
    Batch::Verdict& verdict = batch.verdicts[i];
    verdict.done = event.sinks_done;
    if (held.holds(event)) {
      verdict.deferred = true;  // an earlier event of its key was not delivered: release it
      continue;
    }
    if (auto error = parse_headers(event.headers_json, event.headers)) {
      verdict.permanent = "invalid event: " + *error;
      continue;
    }
    if (event.created_at.empty()) {
      verdict.permanent =
          "invalid event: created_at is not a time the relay can carry (RFC 3339: years 0001 to 9999; "
          "not infinity)";
      continue;
    }
    const auto routed = router_->sinks_for(event.topic);
    if (routed.empty()) {
      verdict.permanent = "no route matches topic '" + event.topic + "'";
      continue;
    }
    batch.bytes += event_bytes(event);
    for (std::size_t s : routed) {
      const auto& done = verdict.done;
      if (std::find(done.begin(), done.end(), sinks_[s]->name()) != done.end()) continue;
      batch.per_sink[s].push_back(&event);
      batch.per_sink_index[s].push_back(i);
    }
  }
  if (batch.bytes >= options_.in_flight_bytes) {
    // Most likely cut by bytes (Store::limit_claim_bytes): its events past the window come next.
    log::debug("a claim held the byte window or more",
               {{"events", batch.events.size()}, {"bytes", batch.bytes}, {"window", options_.in_flight_bytes}});
  }
  return batch;
}

std::size_t RelayLoop::strip_reserved_headers(const Sink& sink, Batch& batch, std::vector<const Event*>& events) {
  std::size_t dropped = 0;
  for (const Event*& event : events) {
    const auto reserved = [&](const Header& h) { return sink.reserves_header(h.first); };
    const auto n = static_cast<std::size_t>(std::count_if(event->headers.begin(), event->headers.end(), reserved));
    if (n == 0) continue;
    for (const Header& h : event->headers) {
      if (reserved(h) && warned_headers_.size() < kMaxWarnedHeaders &&
          warned_headers_.insert(sink.name() + '\n' + h.first).second) {
        log::warn("a row header carries a name the sink reserves: dropped (docs/sinks.md, \"Reserved headers\")",
                  {{"sink", sink.name()}, {"header", h.first}, {"id", event->id}});
      }
    }
    Event& copy = batch.stripped.emplace_back(*event);
    std::erase_if(copy.headers, reserved);
    // The headers' JSON text too, which a sink may send whole (a webhook request of several
    // events carries each event's record in its body).
    copy.headers_json = headers_to_json(copy.headers);
    event = &copy;
    dropped += n;
  }
  return dropped;
}

void RelayLoop::publish(Batch& batch) {
  if (over_window(batch)) return publish_sliced(batch, nullptr);
  for (std::size_t s = 0; s < sinks_.size(); ++s) {
    auto& events = batch.per_sink[s];
    if (events.empty()) continue;
    Sink& sink = *sinks_[s];
    if (const std::size_t dropped = strip_reserved_headers(sink, batch, events)) {
      metrics_.headers_dropped(sink.name(), dropped);
    }
    const auto started = clock_.now();
    std::vector<Outcome> outcomes;
    try {
      outcomes = sink.publish(events);
    } catch (...) {
      // A sink bug or a library's surprise, not a downstream failure: it costs these events a
      // retry, not the process. What the sink may have sent meanwhile is sent again.
      outcomes = sink_threw(sink, events.size());
    }
    record(s, batch, events, batch.per_sink_index[s], std::move(outcomes), started);
  }
}

void RelayLoop::record(std::size_t s, Batch& batch, const std::vector<const Event*>& events,
                       const std::vector<std::size_t>& index, std::vector<Outcome> outcomes,
                       Clock::SteadyTime started) {
  Sink& sink = *sinks_[s];
  metrics_.published(sink.name(), events.size(), seconds_between(started, clock_.now()));
  if (outcomes.size() != events.size()) {
    // A sink bug, not a downstream failure: retry the whole batch rather than guess.
    outcomes.assign(events.size(), Outcome::retry("sink returned " + std::to_string(outcomes.size()) +
                                                  " outcomes for " + std::to_string(events.size()) + " events"));
  }
  hold_back_after_failures(events, outcomes);  // per-key order whatever the sink did
  const auto ack_us = clock_.wall_us();
  for (std::size_t k = 0; k < outcomes.size(); ++k) {
    Batch::Verdict& verdict = batch.verdicts[index[k]];
    const Outcome& outcome = outcomes[k];
    switch (outcome.kind) {
      case OutcomeKind::kDelivered:
        verdict.done.push_back(sink.name());
        metrics_.delivered(sink.name(), static_cast<double>(ack_us - events[k]->created_at_us) / 1e6);
        break;
      case OutcomeKind::kRetry:
        if (!verdict.retry) {
          verdict.retry_reason = sink.name() + ": " + outcome.reason;
          if (!verdict.failed_sink) verdict.failed_sink = &sink.name();
        }
        verdict.retry = true;
        if (outcome.retry_after) {
          verdict.retry_after =
              std::max(verdict.retry_after.value_or(std::chrono::milliseconds{0}), *outcome.retry_after);
        }
        metrics_.retried(sink.name());
        break;
      case OutcomeKind::kPermanent:
        if (verdict.permanent.empty()) {
          verdict.permanent = sink.name() + ": " + outcome.reason;
          verdict.failed_sink = &sink.name();
        }
        break;
      case OutcomeKind::kDeferred: verdict.deferred = true; break;
    }
  }
  if (spans_ != nullptr) [[unlikely]] {
    trace(sink, batch, index, outcomes, ack_us);
  }
}

bool RelayLoop::all_pipelined() const {
  return !sinks_.empty() && std::all_of(sinks_.begin(), sinks_.end(), [](const Sink* s) { return s->pipelined(); });
}

void RelayLoop::submit(Batch& batch, std::size_t sink_index, std::vector<const Event*> events,
                       std::vector<std::size_t> index) {
  if (events.empty()) return;
  Batch::Submission submission{sink_index, std::move(events), std::move(index), {}};
  Sink& sink = *sinks_[submission.sink];
  submission.started = clock_.now();
  try {
    sink.submit(submission.events);
  } catch (...) {
    // As publish(): a retry for these events. The sink must then not keep the submission
    // (Sink::submit() does not throw for downstream failures).
    record(submission.sink, batch, submission.events, submission.index, sink_threw(sink, submission.events.size()),
           submission.started);
    return;
  }
  batch.submissions.push_back(std::move(submission));
}

void RelayLoop::collect(Batch& batch) {
  for (Batch::Submission& sub : batch.submissions) {
    Sink& sink = *sinks_[sub.sink];
    std::vector<Outcome> outcomes;
    try {
      outcomes = sink.collect();
    } catch (...) {
      outcomes = sink_threw(sink, sub.events.size());
    }
    record(sub.sink, batch, sub.events, sub.index, std::move(outcomes), sub.started);
  }
  batch.submissions.clear();
}

void RelayLoop::hold_failed(const Batch& batch, std::size_t from, std::size_t to, KeyHolds& failed) {
  for (std::size_t i = from; i < to; ++i) {
    const Batch::Verdict& v = batch.verdicts[i];
    if (v.retry || v.deferred || !v.permanent.empty()) failed.hold(batch.events[i].key, batch.events[i].id);
  }
}

bool RelayLoop::over_window(const Batch& batch) const {
  return batch.events.size() > 1 && batch.bytes > options_.in_flight_bytes;
}

void RelayLoop::publish_sliced(Batch& batch, Batch* in_flight) {
  for (std::size_t s = 0; s < sinks_.size(); ++s) {
    if (const std::size_t dropped = strip_reserved_headers(*sinks_[s], batch, batch.per_sink[s])) {
      metrics_.headers_dropped(sinks_[s]->name(), dropped);
    }
  }
  KeyHolds failed;  // keys with an event not delivered so far: their later events are released
  if (in_flight) {
    collect(*in_flight);
    hold_failed(*in_flight, 0, in_flight->events.size(), failed);
  }
  std::vector<std::size_t> next(sinks_.size(), 0);  // per sink: its first event not yet handed over
  for (std::size_t begin = 0; begin < batch.events.size();) {
    // The slice [begin, end): as many events as fit in the window, at least one.
    std::size_t end = begin, bytes = 0;
    while (end < batch.events.size() &&
           (end == begin || bytes + event_bytes(batch.events[end]) <= options_.in_flight_bytes)) {
      bytes += event_bytes(batch.events[end]);
      ++end;
    }
    for (std::size_t s = 0; s < sinks_.size(); ++s) {
      const auto& events = batch.per_sink[s];
      const auto& index = batch.per_sink_index[s];
      std::vector<const Event*> slice;
      std::vector<std::size_t> at;
      for (std::size_t& k = next[s]; k < events.size() && index[k] < end; ++k) {
        if (failed.holds(events[k]->key)) {
          batch.verdicts[index[k]].deferred = true;  // released unpublished, like a sink's deferred event
          continue;
        }
        slice.push_back(events[k]);
        at.push_back(index[k]);
      }
      submit(batch, s, std::move(slice), std::move(at));
    }
    collect(batch);
    hold_failed(batch, begin, end, failed);
    begin = end;
  }
}

void RelayLoop::publish_pipelined(Batch& batch, Batch* in_flight, bool leave) {
  if (over_window(batch)) return publish_sliced(batch, in_flight);
  // Events of a key with an event in the batch still in the sinks wait for its outcomes; all of
  // them do when the two batches together pass the byte window (LoopOptions::in_flight_bytes).
  std::vector<bool> behind;
  if (in_flight) {
    behind = in_flight->bytes + batch.bytes <= options_.in_flight_bytes ? events_behind(batch.events, in_flight->events)
                                                                        : std::vector<bool>(batch.events.size(), true);
  }
  std::vector<Batch::Submission> waiting(sinks_.size());
  for (std::size_t s = 0; s < sinks_.size(); ++s) {
    auto& events = batch.per_sink[s];
    if (events.empty()) continue;
    if (const std::size_t dropped = strip_reserved_headers(*sinks_[s], batch, events)) {
      metrics_.headers_dropped(sinks_[s]->name(), dropped);
    }
    Batch::Submission now;
    now.sink = s;
    waiting[s].sink = s;
    for (std::size_t k = 0; k < events.size(); ++k) {
      const std::size_t i = batch.per_sink_index[s][k];
      Batch::Submission& to = !behind.empty() && behind[i] ? waiting[s] : now;
      to.events.push_back(events[k]);
      to.index.push_back(i);
    }
    submit(batch, s, std::move(now.events), std::move(now.index));
  }
  if (in_flight) {
    collect(*in_flight);
    KeyHolds failed;  // keys with an event the batch in flight did not deliver (retried, released, dead)
    hold_failed(*in_flight, 0, in_flight->events.size(), failed);
    for (Batch::Submission& w : waiting) {
      Batch::Submission later;
      later.sink = w.sink;
      for (std::size_t k = 0; k < w.events.size(); ++k) {
        if (failed.holds(w.events[k]->key)) {
          batch.verdicts[w.index[k]].deferred = true;  // released unpublished, like a sink's deferred event
        } else {
          later.events.push_back(w.events[k]);
          later.index.push_back(w.index[k]);
        }
      }
      submit(batch, w.sink, std::move(later.events), std::move(later.index));
    }
  }
  if (!leave) collect(batch);
}

void RelayLoop::trace(const Sink& sink, const Batch& batch, const std::vector<std::size_t>& index,
                      const std::vector<Outcome>& outcomes, std::int64_t ack_us) const {
  std::vector<SendSpan> spans;
  for (std::size_t k = 0; k < outcomes.size(); ++k) {
    const Outcome& outcome = outcomes[k];
    if (outcome.kind == OutcomeKind::kDeferred) continue;  // not attempted: no send to show
    // The row as claimed, not the copy without the sink's reserved headers.
    const Event& event = batch.events[index[k]];
    const auto parent = event_trace_parent(event);
    // An unsampled parent: the writer's trace is not being recorded, so neither is this span.
    if (parent ? !parent->sampled : !spans_->root_spans()) continue;
    SendSpan& span = spans.emplace_back();
    if (parent) {
      span.trace_id = parent->trace_id;
      span.parent_span_id = parent->span_id;
    }
    span.start_us = event.claimed_at_us;
    span.end_us = ack_us;
    span.created_at_us = event.created_at_us;
    span.event_id = event.id;
    span.attempt = event.attempts + 1;
    span.system = sink.messaging_system();
    span.destination = sink.destination(event);
    span.sink = sink.name();
    if (outcome.kind != OutcomeKind::kDelivered) {
      span.failed = true;
      span.error = outcome.reason;
    }
  }
  if (!spans.empty()) spans_->submit(spans);
}

void RelayLoop::retry_unsettled(Batch& batch, const std::string& why) {
  for (Batch::Verdict& verdict : batch.verdicts) {
    if (!verdict.permanent.empty() || verdict.deferred || verdict.retry) continue;
    verdict.retry = true;
    verdict.retry_reason = std::string(kNoSink) + ": " + why;
  }
}

std::vector<Completion> RelayLoop::settle(Batch& batch, BatchResult& result, KeyHolds& held_out) {
  std::vector<Completion> completions;
  completions.reserve(batch.events.size());
  result.claimed += batch.events.size();
  for (std::size_t i = 0; i < batch.events.size(); ++i) {
    const Event& event = batch.events[i];
    Batch::Verdict& verdict = batch.verdicts[i];
    Completion c;
    c.id = event.id;
    c.created_at_us = event.created_at_us;
    c.sinks_done = std::move(verdict.done);
    const std::string& label = verdict.failed_sink ? *verdict.failed_sink : std::string(kNoSink);
    const int attempts = event.attempts + 1;
    if (!verdict.permanent.empty()) {
      c.kind = Completion::Kind::kDeadLetter;
      c.error = std::move(verdict.permanent);
    } else if (verdict.retry && attempts >= options_.max_attempts) {
      c.kind = Completion::Kind::kDeadLetter;
      c.error = "gave up after " + std::to_string(attempts) + " attempts: " + verdict.retry_reason;
    } else if (verdict.retry) {
      c.kind = Completion::Kind::kRetry;
      c.error = std::move(verdict.retry_reason);
      c.delay = backoff_delay(options_.backoff, attempts, jitter01_(), verdict.retry_after);
      ++result.retried;
    } else if (verdict.deferred) {
      c.kind = Completion::Kind::kRelease;
      ++result.released;
    } else {
      c.kind = Completion::Kind::kDelivered;
      ++result.delivered;
    }
    if (c.kind == Completion::Kind::kDeadLetter) {
      metrics_.dead_lettered(label);
      ++result.dead_lettered;
    }
    if (c.kind == Completion::Kind::kRetry || c.kind == Completion::Kind::kRelease) held_out.hold(event.key, event.id);
    completions.push_back(std::move(c));
  }
  return completions;
}

}  // namespace outbox
