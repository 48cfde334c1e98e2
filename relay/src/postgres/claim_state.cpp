#include "postgres/claim_state.hpp"

#include <algorithm>

namespace outbox::pg {

void ClaimState::session_lost() {
  set_owned(0);
  resolved_ = -1;
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
  // An idle relay polls every idle_poll_interval: a plain index probe costs about half of a poll
  // statement, which answers the same question first when events flow.
  return probe && quiet_ && floor_id() >= 0 && !has_completions && !lanes_.reading_pending();
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
  // Held back by an open writer (or a locked row): the runner keeps polling at the short interval.
  fenced_ = held_now != 0 && claimed < limit;
  return held_now;
}

std::optional<long long> ClaimState::watch_from(bool connected) const {
  // The state in which a poll asks "anything new above resolved?" first: the last claim was a
  // poll that found nothing and was not held back, so every id up to resolved is claimed or gone,
  // and every id above it but up to a pending reading's last id was drawn before that reading
  // (reading_pending: a claim checks those).
  if (!connected || !quiet_ || fenced_ || resolved_ < 0) return std::nullopt;
  if (owned_ == 0) return std::nullopt;  // its drains claim nothing: the watch would fire again and again
  return std::max(lanes_.resolved(), lanes_.pending_last());
}

std::optional<long long> ClaimState::sweep_upto(bool connected) const {
  // Polls claim above each lane's bound; what waits below it, only a claim from the start or a
  // sweep finds.
  if (!connected || resolved_ < 0) return std::nullopt;
  long long upto = resolved_;
  for (int lane = 0; lane < kLaneCount; ++lane) {
    if ((owned_ & lane_bit(lane)) != 0) upto = std::max(upto, lanes_.covered()[static_cast<std::size_t>(lane)]);
  }
  return upto;
}

}  // namespace outbox::pg
