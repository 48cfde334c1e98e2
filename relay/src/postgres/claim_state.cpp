#include "postgres/claim_state.hpp"

#include <algorithm>

namespace outbox::pg {

ClaimState::SchemaSeen ClaimState::compare(const ClaimFunctions& found, bool at_connect) const {
  SchemaSeen seen;
  seen.changed = found.plain != functions_.plain || found.floor != functions_.floor || found.lanes != functions_.lanes;
  seen.prepare = found.plain && (at_connect || seen.changed);
  return seen;
}

void ClaimState::use(const ClaimFunctions& found, const SchemaSeen& seen) {
  if (seen.prepare && found.lanes) lanes_.reset();
  functions_ = found;
}

void ClaimState::session_lost() {
  set_owned(0);
  resolved_ = -1;
  reading_last_ = -1;
  lanes_.reset();
}

void ClaimState::set_owned(LaneMask owned) {
  owned_ = owned;
  lanes_.set_owned(owned);
}

void ClaimState::lanes_gained() {
  resolved_ = -1;
  lanes_.uncover();
}

bool ClaimState::ask_anything_new_first(bool probe, bool has_completions) const {
  // An idle relay polls every idle_poll_interval: a plain index probe costs about half of calling
  // the function, which answers the same question first when events flow.
  return probe && quiet_ && floor_id() >= 0 && !has_completions && !(functions_.lanes && lanes_.reading_pending());
}

void ClaimState::function_claimed(bool probe, std::size_t limit, std::size_t claimed, long long bound,
                                  long long last_id, std::optional<long long> reading_last,
                                  std::string_view reading_holders) {
  resolved_ = std::max(resolved_, bound);
  reading_last_ = reading_last.value_or(-1);
  if (reading_last_ >= 0) reading_holders_.assign(reading_holders);
  quiet_ = probe && claimed == 0;
  // Held back by an open writer: the runner keeps polling at the short interval.
  fenced_ = bound < last_id && claimed < limit;
}

LaneMask ClaimState::lanes_claimed(Time now, bool probe, std::size_t limit, std::size_t claimed,
                                   const std::optional<LaneIds>& lane_bounds, long long last_id) {
  if (lane_bounds) {
    lanes_.claimed(now, owned_, *lane_bounds, last_id);
  } else {
    lanes_.unchanged(now, owned_, last_id);
  }
  resolved_ = lanes_.resolved();
  const LaneMask held_now = lanes_.held(owned_);
  quiet_ = probe && claimed == 0 && held_now == 0;
  // Held back by an open writer: the runner keeps polling at the short interval.
  fenced_ = held_now != 0 && claimed < limit;
  return held_now;
}

void ClaimState::statements_claimed(std::size_t limit, std::size_t claimed, long long last_id, long long fence) {
  // Held back by an open writer: poll again soon, as a writer that rolls back rings no bell.
  fenced_ = fence < last_id && claimed < limit;
}

std::optional<long long> ClaimState::watch_from(bool connected) const {
  // The state in which a poll asks "anything new above resolved?" first: the last call of the
  // claim function was a poll that found nothing and was not held back by a writer, so every id
  // up to resolved is claimed or gone, and every id above it but up to a pending reading's last
  // id was drawn before that reading (reading_pending: a claim checks those).
  if (!connected || !functions_.plain || !quiet_ || fenced_ || resolved_ < 0) return std::nullopt;
  if (owned_ == 0) return std::nullopt;  // its drains claim nothing: the watch would fire again and again
  if (functions_.lanes) return std::max(lanes_.resolved(), lanes_.pending_last());
  return std::max(resolved_, reading_last_);
}

bool ClaimState::reading_pending() const {
  if (functions_.lanes) return lanes_.reading_pending();
  return functions_.plain && reading_last_ >= 0;
}

std::optional<long long> ClaimState::sweep_upto(bool connected) const {
  // Polls claim above resolved; what waits below it, only a claim from the start or a sweep finds.
  if (!connected || !functions_.plain || resolved_ < 0) return std::nullopt;
  if (functions_.lanes) {  // polls look above each lane's bound
    long long upto = resolved_;
    for (int lane = 0; lane < kLaneCount; ++lane) {
      if ((owned_ & lane_bit(lane)) != 0) upto = std::max(upto, lanes_.covered()[static_cast<std::size_t>(lane)]);
    }
    return upto;
  }
  return resolved_;
}

}  // namespace outbox::pg
