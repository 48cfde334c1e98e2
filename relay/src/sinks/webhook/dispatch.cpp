#include "sinks/webhook/dispatch.hpp"

#include <algorithm>
#include <cassert>

namespace outbox::sinks::webhook {

KeyedDispatch::KeyedDispatch(std::span<const Event* const> events) : events_(events), lane_of_(events.size()) {
  std::unordered_map<std::string_view, std::size_t> by_key;
  by_key.reserve(events.size());
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto [it, inserted] = by_key.try_emplace(events[i]->key, lanes_.size());
    if (inserted) {
      lanes_.emplace_back();
      ready_.push_back(it->second);
    }
    lanes_[it->second].events.push_back(i);
    lane_of_[i] = it->second;
  }
}

std::optional<std::size_t> KeyedDispatch::next() {
  if (ready_.empty()) return std::nullopt;
  Lane& lane = lanes_[ready_.front()];
  ready_.pop_front();
  assert(!lane.busy && lane.sent < lane.events.size());
  lane.busy = true;
  ++in_flight_;
  return lane.events[lane.sent++];
}

void KeyedDispatch::finish(std::size_t index, bool hold_key) {
  const std::size_t id = lane_of_.at(index);
  Lane& lane = lanes_[id];
  assert(lane.busy && lane.events[lane.sent - 1] == index);
  lane.busy = false;
  --in_flight_;
  if (hold_key) {
    held_.hold(events_[index]->key, events_[index]->id);
  } else if (lane.sent < lane.events.size()) {
    ready_.push_back(id);
  }
}

std::vector<KeyedDispatch::Unsent> KeyedDispatch::unsent() const {
  std::vector<Unsent> out;
  for (const Lane& lane : lanes_) {
    for (std::size_t k = lane.sent; k < lane.events.size(); ++k) {
      out.push_back({lane.events[k], held_.holds(*events_[lane.events[k]])});
    }
  }
  std::sort(out.begin(), out.end(), [](const Unsent& a, const Unsent& b) { return a.index < b.index; });
  return out;
}

}  // namespace outbox::sinks::webhook
