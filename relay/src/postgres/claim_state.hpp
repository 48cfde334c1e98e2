#pragma once
// What PgStore knows between claims: which claim the table's schema offers, how far every id is
// committed or gone (resolved), the claim function's reading of the writers, whether the last poll
// found nothing (quiet) or was held back by an open writer (fenced). A pure state machine: no I/O,
// no libpq types, time comes in as arguments; PgStore feeds it what its statements return and
// asks it what to send next.
//
// The rule it keeps (docs/design.md, "Ordering"): no id is published past one that may still
// commit. The schemas' paths:
//  - schema 1 (no claim function): two statements, the claim bound min(last id, lowest fence);
//  - schema 2 and 3/4 ({prefix}_claim, then with a floor): one call with resolved and the last
//    reading of the writers (reading_last, reading_holders), which it answers with a new bound;
//  - schema 5 (lanes, {prefix}_writers): per-lane bounds kept by core/lane_bounds.
// A poll (probe) that follows a quiet poll first asks "anything new above resolved?" (a plain
// index probe) and calls the claim function only when there is.
#include <algorithm>
#include <chrono>
#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

#include "core/lane_bounds.hpp"

namespace outbox::pg {

// The claim functions a table has (PgStore looks at connect, at every rebalance before schema 5,
// and when schema 1's fence statement sees one appear).
struct ClaimFunctions {
  bool plain = false;  // schema 2's {prefix}_claim (without it: schema 1's statements)
  bool floor = false;  // schema 3's, which takes a floor (Store::claim_above)
  bool lanes = false;  // schema 5's, lane by lane, and {prefix}_writers
};

class ClaimState {
 public:
  using Time = LaneBounds::Time;

  // --- The schema.
  struct SchemaSeen {
    bool prepare = false;  // the session must prepare the statements of the functions found
    bool changed = false;  // they differ from what was known
  };
  // What a look at the table found; at_connect: on a new session.
  SchemaSeen compare(const ClaimFunctions& found, bool at_connect) const;
  // Once the session prepared what `seen` asked for: the functions in use. The lane bounds start
  // afresh when lane statements were prepared (the other claim function's are not carried over).
  void use(const ClaimFunctions& found, const SchemaSeen& seen);
  const ClaimFunctions& functions() const { return functions_; }
  bool by_function() const { return functions_.plain; }
  bool by_lanes() const { return functions_.lanes; }
  // Schema 1, or no lanes yet: a poll completes, then claims, in two steps.
  bool poll_in_two_steps() const { return !functions_.plain || owned_ == 0; }

  // --- The session and its lanes.
  // The work session is gone (and its lanes with it): nothing is resolved, no reading is pending.
  // quiet and fenced stay as they were; with resolved unknown no watch is offered.
  void session_lost();
  void set_owned(LaneMask owned);
  LaneMask owned() const { return owned_; }
  // Lanes were gained: they may hold events below what was resolved, so the next claim, even a
  // poll, looks from the start.
  void lanes_gained();

  // --- Before a claim by function.
  // What a poll's "anything new?" probe looks above: the lanes' common bound, or resolved.
  long long floor_id() const { return functions_.lanes ? lanes_.resolved() : resolved_; }
  // Whether the claim asks "anything new above floor_id()?" first: a poll after a quiet poll,
  // with the bound known, no outcomes to write and no reading waiting for writers to end.
  bool ask_anything_new_first(bool probe, bool has_completions) const;
  // Schema 5: whether to read the writers before the claim, and what that reading found.
  bool reading_due(Time now) const { return lanes_.reading_due(now, owned_); }
  void writers_read(Time now, const WriterReading& reading) { lanes_.read(now, reading); }

  // --- What a claim sends (schema 2 and 3: resolved and the reading; schema 5: lanes()).
  long long resolved() const { return resolved_; }
  long long reading_last() const { return reading_last_; }
  const std::string& reading_holders() const { return reading_holders_; }
  const LaneBounds& lanes() const { return lanes_; }

  // --- What a claim answered. claimed: how many events it returned of limit.
  // Schema 2 and 3: the function's bound and last id, and its reading (nullopt: none pending).
  void function_claimed(bool probe, std::size_t limit, std::size_t claimed, long long bound, long long last_id,
                        std::optional<long long> reading_last, std::string_view reading_holders);
  // Schema 5: each lane's bound (nullopt: a poll that returned at once, the bounds unchanged) and
  // the last id drawn. Returns the owned lanes whose events are held back.
  LaneMask lanes_claimed(Time now, bool probe, std::size_t limit, std::size_t claimed,
                         const std::optional<LaneIds>& lane_bounds, long long last_id);
  // Schema 1: the claim bound from the last id drawn and the lowest open fence.
  static long long statement_bound(long long last_id, long long fence) { return std::min(last_id, fence); }
  void statements_claimed(std::size_t limit, std::size_t claimed, long long last_id, long long fence);

  // --- Questions (Store's).
  // The last claim stopped below an open writer: poll again soon (a writer that rolls back rings
  // nothing).
  bool fenced() const { return fenced_; }
  bool quiet() const { return quiet_; }
  // Schema 5: the owned lanes held back by writers.
  LaneMask held() const { return lanes_.held(owned_); }
  // Store::watch_from: above what the idle watch may wait for a new id; connected: a work session.
  std::optional<long long> watch_from(bool connected) const;
  // Store::reading_pending.
  bool reading_pending() const;
  // Store::sweep_upto: up to where a poll does not look (only a sweep does).
  std::optional<long long> sweep_upto(bool connected) const;

 private:
  ClaimFunctions functions_;
  LaneMask owned_ = 0;
  LaneBounds lanes_;
  bool fenced_ = false;      // the last claim stopped at an open writer's fence
  bool quiet_ = false;       // the last poll found nothing new: the next one asks "anything new?" first
  long long resolved_ = -1;  // every id up to it is committed or gone (the last bound); -1: unknown
  // The claim function's reading of the writers (schema/002): the last id drawn then, and the
  // transactions that held the table's ROW EXCLUSIVE lock then (a text[] literal); -1: none.
  long long reading_last_ = -1;
  std::string reading_holders_ = "{}";
};

}  // namespace outbox::pg
