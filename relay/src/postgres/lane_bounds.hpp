#pragma once
// What the relay knows, lane by lane, of the ids that may still commit (schema/005, 010), and when
// it reads the writers again. A pure state machine: no I/O, time comes in as arguments; the
// Postgres store feeds it the claim's results and the readings of {prefix}_writers. Postgres-only:
// it lives beside postgres/claim_state, which holds it.
//
// The rule (schema/005 states the argument): a lane is resolved up to an id when every id up to it
// in that lane is committed or gone for good. A claim publishes a lane's events only up to the
// lane's bound, which is never above what is resolved there:
//  - every lane is resolved up to the walk from resolved() (the ids without a gap above it);
//  - a reading (its last id v, the transactions holding the table's ROW EXCLUSIVE lock) in which
//    every holder is complete resolves every lane that no holder marked up to v;
//  - a reading with a holder that is not complete resolves the same once every such holder has
//    ended (seen gone from a later reading), and every lane once every holder has ended;
//  - a lane is resolved up to the last id of the latest reading that none of its holders was open
//    at (they took the table's lock after it, and drew every id above it).
// Knowledge only grows: a lane resolved up to v stays so (new ids are drawn above v).
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "core/writer_holds.hpp"

namespace outbox::pg {

struct WriterReading {
  long long last_id = -1;
  std::vector<OpenWriter> writers;
  // Ids the sequence hands a session at a time (schema/010). Above 1 a session may draw ids below
  // last_id later, holding no lock at the reading: such a reading resolves nothing.
  long long sequence_cache = 1;
};

// How often the writers are read while events are held back.
struct ReadingPace {
  // A bound that has not moved for this long while ids above it were drawn: read the writers.
  std::chrono::milliseconds stall{25};
  // At most this often while the highest lane bound is stalled, or a reading waits for holders
  // that were not complete: other lanes' events wait for it.
  std::chrono::milliseconds frontier_every{25};
  // At most this often while only some lanes are held (their writer is known; a reading tells
  // when it has ended, and who it is).
  std::chrono::milliseconds held_every{100};
};

class LaneBounds {
 public:
  using Time = std::chrono::steady_clock::time_point;

  explicit LaneBounds(ReadingPace pace = {}) : pace_(pace) { reset(); }

  // Nothing known (a new session, or the sequence was set back below what was known).
  void reset();
  // Lanes gained (rebalance): they may hold events below what this instance's claims covered, so
  // polls look from the start in every lane until the next claim. What is resolved stays known.
  void uncover();
  // The lanes this instance owns now (resolved() is their minimum).
  void set_owned(LaneMask owned) { owned_ = owned; }

  // The claim function's answer: each lane's bound, up to which that claim took events (all of
  // them unless it was full), and the last id drawn.
  // owned: this instance's lanes (their bounds tell whether events are held back, and only theirs
  // are known from a claim).
  void claimed(Time now, LaneMask owned, const LaneIds& lane_bounds, long long last_id);
  // A poll that returned at once (nothing new): the bounds are as they were.
  void unchanged(Time now, LaneMask owned, long long last_id);
  // A reading of the writers (taken before a claim). One whose sequence caches more than one id
  // per session resolves nothing: every lane then moves on only through ids committed without a
  // gap (the claim's walk).
  void read(Time now, const WriterReading& reading);

  // Before a claim: whether to read the writers first. owned: this instance's lanes.
  bool reading_due(Time now, LaneMask owned) const;

  // Every id up to it, in every lane this instance owned at the last claim, is committed or gone;
  // -1: unknown.
  long long resolved() const;
  // Per lane: every id up to it is committed or gone (>= resolved(), or -1).
  const LaneIds& known() const { return known_; }
  // Per lane: the bound of the last claim (what a poll looks above); -1: from the start.
  const LaneIds& covered() const { return covered_; }
  long long last_id() const { return last_id_; }
  // Every owned lane is known and covered up to resolved(): a claim needs no per-lane bounds.
  bool uniform() const;
  // Lanes of `owned` whose bound is below the last id drawn: their later events wait.
  LaneMask held(LaneMask owned) const;
  // A reading with holders that were not complete waits for them to end.
  bool reading_pending() const { return pending_.has_value(); }
  // The last id of that reading (ids above it were drawn after it), or -1.
  long long pending_last() const { return pending_ ? pending_->last_id : -1; }
  // The last reading (for metrics, logs and status).
  const WriterReading& last_reading() const { return last_reading_; }

 private:
  void resolve(long long upto, LaneMask lanes);
  // The sequence was set back below what is known (TRUNCATE ... RESTART IDENTITY, ALTER SEQUENCE
  // ... RESTART, setval): forgets what it knew, as at a new session. Returns whether it did.
  bool forget_if_set_back(long long last_id);
  // Notes when the highest and the lowest bound of the owned lanes last moved.
  void track(Time now, LaneMask owned);
  // Applies a reading whose holders still open (those of `open`) are all complete.
  void apply(const WriterReading& reading, const WriterReading& open);
  // A writer that a reading did not see had drawn no id then (every INSERT takes the table's ROW
  // EXCLUSIVE lock before it draws one): when a later reading first sees it, its ids are all above
  // the earlier reading's last id. A lane is resolved up to the lowest such bound of the writers
  // that hold it now: an event committed before they began does not wait for them (found by
  // tests/fuzz: after a rollback below it, an event waited for every later writer of its lane).
  void resolve_below_new_writers(const WriterReading& reading);

  ReadingPace pace_;
  LaneMask owned_ = 0;
  LaneIds known_{};
  LaneIds covered_{};
  long long last_id_ = -1;
  std::optional<WriterReading> pending_;
  WriterReading last_reading_;
  // Per holder of the last reading (by vxid): every id it drew is above this (the last id of the
  // reading before the one that first saw it; -1: no such reading, or a prepared transaction).
  std::map<std::string, long long> above_;
  long long previous_last_ = -1;  // the last reading's last id (-1: none, or its sequence cached ids)
  std::optional<Time> read_at_;
  Time frontier_moved_{};
  Time floor_moved_{};
  long long frontier_ = -1;
  long long floor_ = -1;
  long long tracked_last_ = -1;  // the last id drawn at the previous track()
};

// The writers of a reading that hold back events of `held` lanes: not complete, or marks in them.
std::vector<const OpenWriter*> writers_holding(const WriterReading& reading, LaneMask held);

}  // namespace outbox::pg
