#pragma once
// The store seam: the outbox table as the loop sees it.
#include <chrono>
#include <optional>
#include <span>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/db_error.hpp"
#include "core/event.hpp"
#include "core/writer_holds.hpp"

namespace outbox {

// The database is unreachable, the session was lost, or the database refuses the work (its class
// says which). The runner reconnects with backoff.
class StoreUnavailable : public DbError {
 public:
  using DbError::DbError;
};

struct Completion {
  enum class Kind {
    kDelivered,   // every routed sink acknowledged: processed_at = now() (or delete)
    kRetry,       // attempts + 1, next attempt after delay, last_error
    kDeadLetter,  // attempts + 1, dead_lettered_at = now(), last_error
    kRelease,     // not attempted: clear the lease, attempts unchanged
  };
  EventId id = 0;
  Kind kind = Kind::kDelivered;
  std::chrono::milliseconds delay{0};
  std::string error;
  std::vector<std::string> sinks_done;  // the complete new set, when partly delivered
  // The event's created_at (Event::created_at_us; 0: unknown). An outcome touches no row created
  // later: after the id sequence was set back, a new row may carry this event's id (schema/010).
  long long created_at_us = 0;
};

// Called from the loop thread only, except complete(), which may run on another thread at the same
// time as claim() (never beside another complete()). Every method may throw StoreUnavailable.
class Store {
 public:
  virtual ~Store() = default;
  // Opens the session if it is not open (a no-op when it is), or replaces one that failed on a
  // statement. Throws StoreUnavailable.
  virtual void connect() {}
  // After a call threw: whether the session failed on a statement and is still open, holding its
  // lanes (a lost session has freed them already), and closing it, which frees them. Between the
  // two the runner writes the outcomes the loop holds: a poll's events carry no lease, and a peer
  // that took the lanes first would claim those events and send them again.
  virtual bool failed_session_open() const { return false; }
  virtual void close_failed_session() {}
  // Re-divides the ordering lanes among the live instances. Returns true when this instance
  // gained lanes, which the runner then catches up.
  virtual bool rebalance() { return false; }
  // How many lanes this instance owns now (claims in). Any thread.
  virtual int lanes_owned() const { return kLaneCount; }
  // Which table of which database cluster this store reads, once connected, for sinks that keep
  // progress downstream (Sink::store_identity); empty when it does not say.
  virtual std::string identity() const { return {}; }
  // Leases and returns up to limit due events of the lanes this instance owns, in id order,
  // committed before returning (no transaction stays open while sinks work).
  virtual std::vector<Event> claim(std::size_t limit) = 0;
  // claim(), made while the previous batch of a drain, whose highest id is floor, is still in the
  // sinks, and every earlier batch of that drain was delivered: nothing at or below floor in these
  // lanes can be claimable then but events that wait for a retry, so the store may look above
  // floor only (unless such an event is below it). Cheaper in a long drain: the claim need not
  // walk past everything delivered since the start of the drain.
  virtual std::vector<Event> claim_above(std::size_t limit, long long floor) {
    (void)floor;
    return claim(limit);
  }
  // Every claim from here on (claim, claim_above, probe_claim) stops adding events once their
  // bytes reach `bytes` (the first always goes), so that it holds at most about that much besides
  // its last event, and bounds what it covered at its last event: the events past the cut are
  // claimed next. 0: no bound. The loop sets relay.in_flight_bytes, at start and at each reload.
  virtual void limit_claim_bytes(std::size_t bytes) { (void)bytes; }
  // The runner's poll, called every few milliseconds while events flow: first applies the
  // completions (the outcomes of the batch published since the last poll, as complete() would),
  // then claims like claim(), except that the store may return nothing at once when it knows no
  // event was committed since its last claim or poll (so events that only became due or
  // claimable again wait for a claim(): a retry timer, a sweep, a rebalance). Cheap when nothing
  // is new. The events it returns may carry no lease (a poll claims only above what earlier
  // claims covered, and the lanes are this instance's alone): until their outcomes are written,
  // the caller must not claim() or rebalance(), which could hand them out again.
  // Throws StoreUnavailable; the completions may then have been applied or not, and the
  // caller applies them again, as after a failed complete().
  virtual std::vector<Event> probe_claim(std::size_t limit, std::span<const Completion> completions) {
    complete(completions);
    return claim(limit);
  }
  // How long until the earliest event of this instance's lanes that waits for a retry falls due;
  // nullopt when none waits. The loop tracks the retries it scheduled itself; this also finds
  // those an instance that stopped or lost the lanes scheduled (which polls, looking only above
  // what earlier claims covered, never see), so that they go out when due, not at the next sweep.
  virtual std::optional<std::chrono::milliseconds> retry_due_in() { return std::nullopt; }
  // Applies the outcomes of claimed batches in one transaction. A claim running at the same time
  // may or may not see them.
  virtual void complete(std::span<const Completion> completions) = 0;
  // True when the last claim held back events because a writer that may still add an earlier
  // event of the same key is open. Its commit rings the bell; the runner also re-polls soon, in
  // case it rolls back instead (a rollback rings nothing).
  virtual bool waiting_for_writers() const { return false; }
  // When the last poll found nothing new and no writer held events back: the id such that every
  // event not yet claimed has a higher one, drawn from the id sequence after it (so an idle loop
  // can wait for the sequence to pass it instead of polling: Waiter::offer_watch). nullopt when
  // that is not known (before the first poll, schema 1, a writer open).
  virtual std::optional<long long> watch_from() const { return std::nullopt; }
  // The sweep's range (Runner): the id up to which events may wait unseen by polls (those below
  // what polls look above: a retry fallen due, a release, an event a poll skipped), so that a sweep
  // can look there in steps (first_claimable) instead of claiming from the start at once; nullopt
  // when not known (before the first claim, schema 1, lanes just gained): the sweep is a full drain.
  virtual std::optional<long long> sweep_upto() const { return std::nullopt; }
  // The lowest id in (after, upto] of an event that claim() would take now (not yet delivered nor
  // dead-lettered, due, its lease clear or expired and not this instance's, in its lanes), or
  // nullopt. A look, not a claim: it locks and writes nothing.
  virtual std::optional<long long> first_claimable(long long after, long long upto) {
    (void)upto;
    return after + 1;  // a store that cannot look: there may be one
  }
  // A reading of the writers that were open at the last claim (schema/002) is still to be
  // checked: a claim() checks it, a poll that finds nothing new does not. watch_from() then
  // gives the reading's last id, above which ids were drawn after it.
  virtual bool reading_pending() const { return false; }
  // The open writer transactions holding back events of this instance's lanes, as last read
  // (schema/005); empty before that schema or when none does.
  virtual WriterHolds writer_holds() const { return {}; }
  // Of ids, those whose rows are still pending (neither delivered nor dead-lettered). A store
  // that cannot look returns them all (the caller then keeps more than it needs, never less).
  virtual std::vector<EventId> still_pending(std::span<const EventId> ids) { return {ids.begin(), ids.end()}; }
};

}  // namespace outbox
