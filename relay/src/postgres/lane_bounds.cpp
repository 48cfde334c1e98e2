#include "postgres/lane_bounds.hpp"

#include <algorithm>
#include <limits>

namespace outbox::pg {

void LaneBounds::reset() {
  known_.fill(-1);
  covered_.fill(-1);
  last_id_ = -1;
  pending_.reset();
  last_reading_ = {};
  above_.clear();
  previous_last_ = -1;
  read_at_.reset();
  frontier_ = floor_ = tracked_last_ = -1;
}

void LaneBounds::uncover() { covered_.fill(-1); }

void LaneBounds::resolve(long long upto, LaneMask lanes) {
  for (int lane = 0; lane < kLaneCount; ++lane) {
    if ((lanes & lane_bit(lane)) != 0) known_[lane] = std::max(known_[lane], upto);
  }
}

long long LaneBounds::resolved() const {
  long long out = -1;
  bool first = true;
  for (int lane = 0; lane < kLaneCount; ++lane) {
    if ((owned_ & lane_bit(lane)) == 0) continue;
    out = first ? known_[lane] : std::min(out, known_[lane]);
    first = false;
  }
  return out;
}

void LaneBounds::track(Time now, LaneMask owned) {
  long long frontier = -1;
  long long floor = -1;
  bool first = true;
  for (int lane = 0; lane < kLaneCount; ++lane) {
    if ((owned & lane_bit(lane)) == 0) continue;
    frontier = first ? covered_[lane] : std::max(frontier, covered_[lane]);
    floor = first ? covered_[lane] : std::min(floor, covered_[lane]);
    first = false;
  }
  // A bound at the last id drawn is not stalled (nothing above it was drawn); one that moved, or
  // was at the last id before, is stalled from now on at the most.
  if (frontier > frontier_ || frontier >= last_id_ || frontier_ >= tracked_last_) frontier_moved_ = now;
  if (floor > floor_ || floor >= last_id_ || floor_ >= tracked_last_) floor_moved_ = now;
  tracked_last_ = last_id_;
  frontier_ = frontier;
  floor_ = floor;
}

bool LaneBounds::forget_if_set_back(long long last_id) {
  // What is known or covered was drawn before: the sequence stood at least there.
  long long top = -1;
  for (int lane = 0; lane < kLaneCount; ++lane) top = std::max({top, known_[lane], covered_[lane]});
  if (last_id >= top) return false;
  const LaneMask owned = owned_;
  reset();
  owned_ = owned;
  return true;
}

void LaneBounds::claimed(Time now, LaneMask owned, const LaneIds& lane_bounds, long long last_id) {
  if (forget_if_set_back(last_id)) {
    // The claim's bounds came from what was known before (the function claims nothing then).
    unchanged(now, owned, last_id);
    return;
  }
  owned_ = owned;
  last_id_ = last_id;
  covered_ = lane_bounds;
  // Only the owned lanes' bounds are knowledge: the claim function computed the others from a
  // walk that started at resolved(), which is the owned lanes' minimum.
  for (int lane = 0; lane < kLaneCount; ++lane) {
    if ((owned & lane_bit(lane)) != 0) known_[lane] = std::max(known_[lane], lane_bounds[lane]);
  }
  track(now, owned);
}

void LaneBounds::unchanged(Time now, LaneMask owned, long long last_id) {
  forget_if_set_back(last_id);
  owned_ = owned;
  last_id_ = last_id;
  track(now, owned);
}

void LaneBounds::apply(const WriterReading& reading, const WriterReading& open) {
  LaneMask marked = 0;
  for (const auto& w : open.writers) marked |= w.holds();
  resolve(reading.last_id, ~marked);
}

void LaneBounds::read(Time now, const WriterReading& reading) {
  forget_if_set_back(reading.last_id);
  read_at_ = now;
  last_reading_ = reading;
  if (reading.sequence_cache > 1) {
    pending_.reset();  // nor does one taken before: its ids may be drawn below its last id too
    above_.clear();
    previous_last_ = -1;
    return;
  }
  resolve_below_new_writers(reading);
  if (pending_) {
    // Which of the pending reading's holders are still open (a transaction keeps its vxid).
    WriterReading open;
    bool incomplete_open = false;
    for (const auto& w : pending_->writers) {
      const bool still = std::any_of(reading.writers.begin(), reading.writers.end(),
                                     [&](const OpenWriter& now_open) { return now_open.vxid == w.vxid; });
      if (!still) continue;
      open.writers.push_back(w);
      incomplete_open = incomplete_open || !w.complete;
    }
    if (!incomplete_open) {
      apply(*pending_, open);
      pending_.reset();
    }
  }
  const bool all_complete =
      std::all_of(reading.writers.begin(), reading.writers.end(), [](const OpenWriter& w) { return w.complete; });
  if (all_complete) {
    apply(reading, reading);
    // A later reading in which every holder is complete does what a pending one would do once its
    // holders end, and more: every lane it leaves held waits for holders that a reading after
    // they end resolves anyway.
    pending_.reset();
  } else if (!pending_) {
    pending_ = reading;
  }
}

void LaneBounds::resolve_below_new_writers(const WriterReading& reading) {
  std::map<std::string, long long> above;
  LaneIds floor;
  floor.fill(std::numeric_limits<long long>::max());
  for (const auto& w : reading.writers) {
    // A prepared transaction keeps its virtual transaction id (PostgreSQL clones it at PREPARE;
    // only one recovered at a server start gets another, and no session of ours outlives that):
    // first seen prepared, it held no lock at the previous reading either.
    const auto seen = above_.find(w.vxid);
    const long long bound = seen != above_.end() ? seen->second : previous_last_;
    above.emplace(w.vxid, bound);
    const LaneMask held = w.holds();
    for (int lane = 0; lane < kLaneCount; ++lane) {
      if ((held & lane_bit(lane)) != 0) floor[lane] = std::min(floor[lane], bound);
    }
  }
  for (int lane = 0; lane < kLaneCount; ++lane) {
    // Lanes no writer holds are resolved up to this reading's last id by apply().
    if (floor[lane] != std::numeric_limits<long long>::max() && floor[lane] >= 0) {
      known_[lane] = std::max(known_[lane], std::min(floor[lane], reading.last_id));
    }
  }
  above_ = std::move(above);
  previous_last_ = reading.last_id;
}

bool LaneBounds::uniform() const {
  const long long r = resolved();
  for (int lane = 0; lane < kLaneCount; ++lane) {
    if ((owned_ & lane_bit(lane)) != 0 && (known_[lane] != r || covered_[lane] != r)) return false;
  }
  return true;
}

LaneMask LaneBounds::held(LaneMask owned) const {
  LaneMask out = 0;
  for (int lane = 0; lane < kLaneCount; ++lane) {
    if ((owned & lane_bit(lane)) != 0 && covered_[lane] < last_id_) out |= lane_bit(lane);
  }
  return out;
}

bool LaneBounds::reading_due(Time now, LaneMask owned) const {
  if (owned == 0) return false;
  const bool never = !read_at_;
  const auto since = never ? Time::duration::max() : now - *read_at_;
  if (never) return true;  // nothing is resolved before the first reading
  if (pending_) return since >= pace_.frontier_every;
  if (held(owned) == 0) return false;
  const bool frontier_stalled = frontier_ < last_id_ && now - frontier_moved_ >= pace_.stall;
  if (frontier_stalled && since >= pace_.frontier_every) return true;
  return floor_ < last_id_ && now - floor_moved_ >= pace_.stall && since >= pace_.held_every;
}

std::vector<const OpenWriter*> writers_holding(const WriterReading& reading, LaneMask held) {
  std::vector<const OpenWriter*> out;
  for (const auto& w : reading.writers) {
    if ((w.holds() & held) != 0) out.push_back(&w);
  }
  return out;
}

}  // namespace outbox::pg
