#include "core/loop.hpp"

#include <algorithm>
#include <nlohmann/json.hpp>

namespace outbox {
namespace {

constexpr std::size_t kMaxTrackedRetries = 100000;
constexpr std::chrono::milliseconds kRetrySlack{20};
constexpr const char* kNoSink = "relay";  // metric label when the relay itself rejects an event

double seconds_between(Clock::SteadyTime from, Clock::SteadyTime to) {
  return std::chrono::duration<double>(to - from).count();
}

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

RelayLoop::RelayLoop(Store& store, std::vector<Sink*> sinks, const Router& router,
                     const Clock& clock, Metrics& metrics, LoopOptions options,
                     std::function<double()> jitter01)
    : store_(store),
      sinks_(std::move(sinks)),
      router_(router),
      clock_(clock),
      metrics_(metrics),
      options_(options),
      jitter01_(std::move(jitter01)) {}

std::optional<Clock::SteadyTime> RelayLoop::next_retry_due() const {
  if (retry_due_.empty()) return std::nullopt;
  return *retry_due_.begin();
}

void RelayLoop::flush_pending() {
  if (pending_.empty()) return;
  store_.complete(pending_);  // throws StoreUnavailable: pending_ stays for the next try
  // The store computes next_attempt_at from its own clock during complete(); counting the delay
  // from now, after it returned (plus a little slack), never wakes the runner before the row
  // is due, which would find nothing to claim and forget the wakeup.
  const auto now = clock_.now();
  for (const auto& c : pending_) {
    if (c.kind == Completion::Kind::kRetry && retry_due_.size() < kMaxTrackedRetries) {
      retry_due_.insert(now + c.delay + kRetrySlack);
    }
  }
  pending_.clear();
}

BatchResult RelayLoop::run_once() {
  flush_pending();
  const auto now = clock_.now();
  retry_due_.erase(retry_due_.begin(), retry_due_.upper_bound(now));

  BatchResult result;
  auto events = store_.claim(options_.batch_size);
  metrics_.claimed(events.size(), seconds_between(now, clock_.now()));
  result.claimed = events.size();
  if (events.empty()) return result;

  pending_ = decide(events, result);
  flush_pending();
  return result;
}

std::vector<Completion> RelayLoop::decide(std::vector<Event>& events, BatchResult& result) {
  std::vector<Verdict> verdicts(events.size());
  std::vector<std::vector<const Event*>> batch(sinks_.size());
  std::vector<std::vector<std::size_t>> batch_index(sinks_.size());

  for (std::size_t i = 0; i < events.size(); ++i) {
    Event& event = events[i];
    Verdict& verdict = verdicts[i];
    verdict.done = event.sinks_done;
    if (auto error = parse_headers(event.headers_json, event.headers)) {
      verdict.permanent = "invalid event: " + *error;
      continue;
    }
    const auto routed = router_.sinks_for(event.topic);
    if (routed.empty()) {
      verdict.permanent = "no route matches topic '" + event.topic + "'";
      continue;
    }
    for (std::size_t s : routed) {
      const auto& done = verdict.done;
      if (std::find(done.begin(), done.end(), sinks_[s]->name()) != done.end()) continue;
      batch[s].push_back(&event);
      batch_index[s].push_back(i);
    }
  }

  for (std::size_t s = 0; s < sinks_.size(); ++s) {
    if (batch[s].empty()) continue;
    Sink& sink = *sinks_[s];
    const auto started = clock_.now();
    auto outcomes = sink.publish(batch[s]);
    metrics_.published(sink.name(), batch[s].size(), seconds_between(started, clock_.now()));
    if (outcomes.size() != batch[s].size()) {
      // A sink bug, not a downstream failure: retry the whole batch rather than guess.
      outcomes.assign(batch[s].size(),
                      Outcome::retry("sink returned " + std::to_string(outcomes.size()) +
                                     " outcomes for " + std::to_string(batch[s].size()) + " events"));
    }
    const auto ack_us = clock_.wall_us();
    for (std::size_t k = 0; k < outcomes.size(); ++k) {
      Verdict& verdict = verdicts[batch_index[s][k]];
      const Outcome& outcome = outcomes[k];
      switch (outcome.kind) {
        case OutcomeKind::kDelivered:
          verdict.done.push_back(sink.name());
          metrics_.delivered(sink.name(), static_cast<double>(ack_us - batch[s][k]->created_at_us) / 1e6);
          break;
        case OutcomeKind::kRetry:
          if (!verdict.retry) {
            verdict.retry_reason = sink.name() + ": " + outcome.reason;
            if (!verdict.failed_sink) verdict.failed_sink = &sink.name();
          }
          verdict.retry = true;
          if (outcome.retry_after) {
            verdict.retry_after = std::max(verdict.retry_after.value_or(std::chrono::milliseconds{0}),
                                           *outcome.retry_after);
          }
          metrics_.retried(sink.name());
          break;
        case OutcomeKind::kPermanent:
          if (verdict.permanent.empty()) {
            verdict.permanent = sink.name() + ": " + outcome.reason;
            verdict.failed_sink = &sink.name();
          }
          break;
        case OutcomeKind::kDeferred:
          verdict.deferred = true;
          break;
      }
    }
  }

  std::vector<Completion> completions;
  completions.reserve(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    Verdict& verdict = verdicts[i];
    Completion c;
    c.id = events[i].id;
    c.sinks_done = std::move(verdict.done);
    const std::string& label = verdict.failed_sink ? *verdict.failed_sink : std::string(kNoSink);
    const int attempts = events[i].attempts + 1;
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
    completions.push_back(std::move(c));
  }
  return completions;
}

}  // namespace outbox
