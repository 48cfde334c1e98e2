#include "core/writer_holds.hpp"

namespace outbox {

std::string describe_lanes(LaneMask lanes) {
  if (lanes == ~LaneMask{0}) return "all";
  std::string out;
  for (int lane = 0; lane < kLaneCount; ++lane) {
    if ((lanes & lane_bit(lane)) == 0) continue;
    if (!out.empty()) out += ',';
    out += std::to_string(lane);
  }
  return out;
}

}  // namespace outbox
