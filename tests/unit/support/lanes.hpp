#pragma once
// Test support: lane bounds (postgres/lane_bounds.hpp) written briefly.
#include "postgres/lane_bounds.hpp"

namespace outbox::testing {

// The same id in every lane.
inline LaneIds all_lanes(long long v) {
  LaneIds ids{};
  ids.fill(v);
  return ids;
}

}  // namespace outbox::testing
