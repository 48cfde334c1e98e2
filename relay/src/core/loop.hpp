#pragma once
// Claim, publish to the routed sinks, complete. No I/O of its own: the store, sinks, clock and
// metrics come in through the constructor. run_once() does one batch; drain() overlaps the sinks'
// work on batch k with completing batch k-1 and claiming batch k+1.
#include <chrono>
#include <cstddef>
#include <exception>
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "core/backoff.hpp"
#include "core/clock.hpp"
#include "core/drain_pipeline.hpp"
#include "core/key_holds.hpp"
#include "core/metrics.hpp"
#include "core/router.hpp"
#include "core/sink.hpp"
#include "core/store.hpp"
#include "core/tracing.hpp"

namespace outbox {

// No defaults here: config/config.hpp holds them, app/options.hpp builds these from a Config.
struct LoopOptions {
  std::size_t batch_size;
  int max_attempts;
  BackoffPolicy backoff;
  // A poll's delivered outcomes (marks or deletes) wait for up to this long, so that a steady
  // stream's outcomes are written tens at a time rather than a poll's few (the statement's fixed
  // cost is most of it), beside a later poll's publishing. Sooner when batch_size of them pile
  // up; carried by the next poll when any other outcome (a retry, a dead letter, a release) is to
  // be written; before every full claim, lane hand-over and shutdown. 0: each poll carries the
  // outcomes of the one before.
  std::chrono::milliseconds outcome_delay;
  // The byte window of pipelined sinks: a batch enters the sinks while the one before is still
  // unacknowledged only if the two hold at most this many bytes of events (payload, key, topic,
  // headers); otherwise it waits for the one before's outcomes, as with an unpipelined sink. A
  // batch larger than this alone goes into the sinks in slices of at most this many bytes (an
  // event larger than it: alone), each collected before the next: a sink never holds more at once
  // (an exactly-once Kafka transaction, a batch under delivery_timeout).
  std::size_t in_flight_bytes;
};

struct BatchResult {
  std::size_t claimed = 0;
  std::size_t delivered = 0;
  std::size_t retried = 0;
  std::size_t dead_lettered = 0;
  std::size_t released = 0;

  BatchResult& operator+=(const BatchResult& other);
};

// How the runner steers a drain. stop and pause_due are asked before every claim.
struct DrainControl {
  // The first claim is the runner's poll (Store::probe_claim): cheap when nothing is new.
  bool probe = false;
  // True: claim nothing more; the batch in flight is finished and completed.
  std::function<bool()> stop = [] { return false; };
  // When pause_due() says so, pause() is called with no batch in flight and every outcome so far
  // written (the runner rebalances lanes there, and may reconfigure() the loop: the next batch
  // is prepared with the new sinks and options).
  std::function<bool()> pause_due = [] { return false; };
  std::function<void()> pause = [] {};
};

// Parses a headers column (a JSON object of strings). Returns an error text for anything else.
std::optional<std::string> parse_headers(const std::string& json, std::vector<Header>& out);

// Added to a retry's delay when the runner wakes for it: a wake before the row is due by the
// database's clock would find nothing to claim and forget the wakeup.
inline constexpr std::chrono::milliseconds kRetrySlack{20};

class RelayLoop {
 public:
  // jitter01 returns uniform numbers in [0, 1). Everything is borrowed and must outlive the loop.
  RelayLoop(Store& store, std::vector<Sink*> sinks, const Router& router, const Clock& clock, Metrics& metrics,
            LoopOptions options, std::function<double()> jitter01);

  // Applies completions left over from a failed complete() (after a reconnect), then claims one
  // batch, publishes it and completes it. Throws StoreUnavailable; the outcomes of a published
  // batch are then kept and applied by the next call, so a lost session costs no re-send.
  BatchResult run_once();

  // Drains until a claim comes back short (and the sinks released nothing), or control.stop().
  // Batch k is published on a helper thread while another completes batch k-1 and this thread
  // claims batch k+1 (DrainPipeline); on return nothing is in flight and every outcome is
  // completed. Throws StoreUnavailable like run_once(), after the batch in flight got its
  // outcomes, which the next call applies. A sink that throws costs its events one retry (the
  // exception's text in last_error), not the drain.
  //
  // Per-key order: the claim of k+1 runs before the outcomes of k (and perhaps k-1) are written,
  // so it may return a later event of a key whose event in k or k-1 failed (the claim's
  // head-of-line rule sees only written retries). Such events are released unpublished, like a
  // sink's deferred events.
  BatchResult drain(const DrainControl& control);

  // Applies completions not yet written (left over from a failed complete(), or by polls that
  // leave them to a later poll), if any.
  void flush_pending();
  const std::vector<Sink*>& sinks() const { return sinks_; }
  bool has_pending() const { return !pending_.empty() || !delayed_outcomes_.empty(); }
  // The lowest id among the outcomes not yet written (has_pending()): between drains, every event
  // this loop claimed below it has its outcome written.
  std::optional<EventId> lowest_unwritten() const;

  // The earliest time a retry scheduled by this loop becomes due, if any is outstanding.
  std::optional<Clock::SteadyTime> next_retry_due() const;

  const LoopOptions& options() const { return options_; }

  // Spans of every send from now on go to `spans` (borrowed: it must outlive the loop); nullptr:
  // none, the default. Off, the loop's whole cost is one branch per claim and one per sink call:
  // no clock read, allocation or header lookup per event. Call before the loop runs.
  void trace_to(SpanSink* spans) { spans_ = spans; }

  // A reload (app/reload.hpp): the sinks, router and options from the next batch on. Call on the
  // loop's thread with nothing in flight only: between drains, or from DrainControl::pause. The
  // old sinks and router are not used after this returns. Outcomes not yet written are kept: they
  // name events by id, and the sinks done by name.
  void reconfigure(std::vector<Sink*> sinks, const Router& router, LoopOptions options);

 private:
  struct Batch;

  // floor: see Store::claim_above (0: none).
  std::vector<Event> claim(bool probe = false, long long floor = 0);
  void write_pending();                                         // pending_ only (flush_pending: delayed_outcomes_ too)
  void take_delayed();                                          // delayed_outcomes_ joins pending_
  void note_written(const std::vector<Completion>& completed);  // after each write: retries, sinks
  // Whether a poll writes the outcomes not yet written in its own call (LoopOptions::outcome_delay).
  bool must_carry() const;
  // Whether outcomes must be written durably (a sink keeps progress downstream: lane groups).
  bool durable_outcomes() const;
  // `held`: keys whose earlier events were not delivered in batches whose outcomes the claim of
  // `events` did not see; their later events are released unpublished.
  Batch prepare(std::vector<Event> events, const KeyHolds& held) const;
  void publish(Batch& batch);  // the sinks' part; may run on a helper thread; does not throw
  // One sink call's outcomes (sink `s`, for `events` at `index` of the batch) into the verdicts,
  // with the per-key rule, metrics and spans.
  void record(std::size_t s, Batch& batch, const std::vector<const Event*>& events,
              const std::vector<std::size_t>& index, std::vector<Outcome> outcomes, Clock::SteadyTime started);
  // Pipelined sinks (Sink::pipelined(), docs/design.md "Pipelined sinks"): whether every sink is.
  bool all_pipelined() const;
  // Submits the batch to the sinks while `in_flight` (may be null) is still in them: events whose
  // key has an event in flight wait until it is collected (core/key_holds.hpp, events_behind()),
  // then go in or are released. Collects `in_flight`, and the batch too unless `leave`.
  void publish_pipelined(Batch& batch, Batch* in_flight, bool leave);
  // Whether the batch holds more bytes than the window (and more than one event): it goes into the
  // sinks in slices (publish_sliced), never left in them.
  bool over_window(const Batch& batch) const;
  // Holds the keys of the events [from, to) of the batch that were not delivered (retried,
  // released, dead-lettered).
  static void hold_failed(const Batch& batch, std::size_t from, std::size_t to, KeyHolds& failed);
  // Collects `in_flight` (may be null), then hands the sinks the batch in slices of at most
  // LoopOptions::in_flight_bytes, each collected before the next; an event whose key did not get
  // through in an earlier slice (or in `in_flight`) is released unpublished.
  void publish_sliced(Batch& batch, Batch* in_flight);
  // Hands a pipelined sink (sinks_[sink]) events of the batch (at `index`); kept in the batch
  // until collect().
  void submit(Batch& batch, std::size_t sink, std::vector<const Event*> events, std::vector<std::size_t> index);
  // The publish work of a turn threw as a whole: the sinks' submissions are collected and what is
  // unsettled retries.
  void publish_failed(Batch* before, Batch& batch, const std::exception_ptr& failure);
  // The end of a drain's turn: the batch that was in the sinks (`in_flight`, collected by now)
  // settles, and `batch` too unless it stays in them (`leave`): it then becomes `in_flight`.
  std::vector<Completion> settle_turn(std::optional<Batch>& in_flight, Batch& batch, bool leave, BatchResult& result,
                                      KeyHolds& failed);
  void collect(Batch& batch);  // waits for the outcomes of every submission of the batch
  // Points `events` (a sink's share of the batch) at copies without the headers the sink reserves
  // (Sink::reserves_header); warns once per sink and name. Returns how many it dropped.
  std::size_t strip_reserved_headers(const Sink& sink, Batch& batch, std::vector<const Event*>& events);
  // Every event of the batch not yet settled gets a retry (the publish work failed as a whole).
  static void retry_unsettled(Batch& batch, const std::string& why);
  // `held_out`: the keys of events neither delivered nor dead-lettered (retried or released).
  std::vector<Completion> settle(Batch& batch, BatchResult& result, KeyHolds& held_out);
  void hand_back(std::vector<Event>& events);  // releases claimed events, unpublished
  // The spans of one sink call (spans_ set): one per attempted event, in the trace of the row's
  // traceparent. `outcomes` are the sink's for `events`, the batch's indexes in `index`.
  void trace(const Sink& sink, const Batch& batch, const std::vector<std::size_t>& index,
             const std::vector<Outcome>& outcomes, std::int64_t ack_us) const;

  Store& store_;
  std::vector<Sink*> sinks_;
  const Router* router_;  // never null; replaced by reconfigure()
  const Clock& clock_;
  Metrics& metrics_;
  LoopOptions options_;
  std::function<double()> jitter01_;
  std::vector<Completion> pending_;
  // Delivered outcomes whose write polls delay for a later poll (LoopOptions::outcome_delay).
  // Written late, not "deferred": OutcomeKind::kDeferred is an event a sink did not attempt.
  std::vector<Completion> delayed_outcomes_;
  Clock::SteadyTime delayed_since_{};           // when the first of delayed_outcomes_ was left
  std::multiset<Clock::SteadyTime> retry_due_;  // bounded; see kMaxTrackedRetries
  std::set<std::string> warned_headers_;        // "sink\nheader" warned about (publish's thread)
  SpanSink* spans_ = nullptr;                   // trace_to(); null: tracing off
  DrainPipeline pipeline_;                      // last: its helpers stop before anything above goes away
};

}  // namespace outbox
