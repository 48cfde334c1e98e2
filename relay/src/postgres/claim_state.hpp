#pragma once
// What PgStore knows between claims: how far every id is committed or gone in each lane (the lane
// bounds of postgres/lane_bounds, fed by {prefix}_writers and {prefix}_claim), whether the last poll
// found nothing (quiet) or was held back by an open writer or a locked row (fenced). A pure state
// machine: no I/O, no libpq types, time comes in as arguments; PgStore feeds it what its statements
// return and asks it what to send next.
//
// The rule it keeps (docs/design.md, "Ordering"): no id is published past one that may still
// commit in its lane. One protocol (schema 10, which `run` requires): the writers' reading when
// due, then the lean poll statement while every lane is alike, else the claim function lane by
// lane. A poll (probe) that follows a quiet poll first asks "anything new above resolved?" (a
// plain index probe) and claims only when there is.
#include <chrono>
#include <cstddef>
#include <optional>

#include "postgres/lane_bounds.hpp"

namespace outbox::pg {

class ClaimState {
 public:
  using Time = LaneBounds::Time;

  // --- The session and its lanes.
  // The work session is gone (and its lanes with it): nothing is resolved, no reading is pending.
  // quiet and fenced stay as they were; with resolved unknown no watch is offered.
  void session_lost();
  void set_owned(LaneMask owned);
  LaneMask owned() const { return owned_; }
  // Lanes were gained: they may hold events below what was resolved, so the next claim, even a
  // poll, looks from the start in every lane.
  void lanes_gained();

  // --- Before a claim.
  // What a poll's "anything new?" probe looks above: the lanes' common bound.
  long long floor_id() const { return lanes_.resolved(); }
  // Whether the claim asks "anything new above floor_id()?" first: a poll after a quiet poll,
  // with the bound known, no outcomes to write and no reading waiting for writers to end.
  bool ask_anything_new_first(bool probe, bool has_completions) const;
  // Whether to read the writers before the claim, and what that reading found.
  bool reading_due(Time now) const { return lanes_.reading_due(now, owned_); }
  void writers_read(Time now, const WriterReading& reading) { lanes_.read(now, reading); }
  const LaneBounds& lanes() const { return lanes_; }
  // Every id up to it is committed or gone in every owned lane, as of the last claim; -1 unknown.
  long long resolved() const { return resolved_; }

  // --- What a claim answered: each lane's bound (nullopt: a poll that returned at once, the
  // bounds unchanged) and the last id drawn; claimed: how many events it returned of limit.
  // Returns the owned lanes whose events are held back.
  LaneMask lanes_claimed(Time now, bool probe, std::size_t limit, std::size_t claimed,
                         const std::optional<LaneIds>& lane_bounds, long long last_id);

  // --- Questions (Store's).
  // The last claim stopped below an open writer or a locked row: poll again soon (a writer that
  // rolls back, a lock that goes, rings nothing).
  bool fenced() const { return fenced_; }
  bool quiet() const { return quiet_; }
  // The owned lanes held back.
  LaneMask held() const { return lanes_.held(owned_); }
  // Store::watch_from: above what the idle watch may wait for a new id; connected: a work session.
  std::optional<long long> watch_from(bool connected) const;
  // Store::reading_pending.
  bool reading_pending() const { return lanes_.reading_pending(); }
  // Store::sweep_upto: up to where a poll does not look (only a sweep does).
  std::optional<long long> sweep_upto(bool connected) const;

 private:
  LaneMask owned_ = 0;
  LaneBounds lanes_;
  bool fenced_ = false;      // the last claim stopped below a held lane
  bool quiet_ = false;       // the last poll found nothing new: the next one asks "anything new?" first
  long long resolved_ = -1;  // lanes_.resolved() as of the last claim; -1: unknown (lanes gained)
};

}  // namespace outbox::pg
