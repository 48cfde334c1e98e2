#include "core/key_holds.hpp"

#include <algorithm>
#include <unordered_set>

namespace outbox {

void KeyHolds::hold(std::string_view key, EventId id) {
  auto it = first_.find(key);
  if (it == first_.end()) {
    first_.emplace(std::string(key), id);
  } else {
    it->second = std::min(it->second, id);
  }
}

bool KeyHolds::holds(const Event& event) const {
  auto it = first_.find(std::string_view(event.key));
  return it != first_.end() && it->second < event.id;
}

bool KeyHolds::holds(std::string_view key) const { return first_.find(key) != first_.end(); }

void KeyHolds::merge(const KeyHolds& other) {
  for (const auto& [key, id] : other.first_) hold(key, id);
}

std::size_t hold_back_after_failures(std::span<const Event* const> events, std::vector<Outcome>& outcomes) {
  KeyHolds held;
  std::size_t changed = 0;
  for (std::size_t i = 0; i < events.size() && i < outcomes.size(); ++i) {
    const Event& event = *events[i];
    Outcome& outcome = outcomes[i];
    switch (outcome.kind) {
      case OutcomeKind::kRetry:
      case OutcomeKind::kDeferred: held.hold(event.key, event.id); break;
      case OutcomeKind::kDelivered:
        if (held.holds(event)) {
          outcome = Outcome::retry(
              "acknowledged, but an earlier event of the same key in this batch must be "
              "retried first; re-sent after it");
          ++changed;
        }
        break;
      case OutcomeKind::kPermanent: break;
    }
  }
  return changed;
}

std::vector<bool> events_behind(std::span<const Event> next, std::span<const Event> in_flight) {
  std::unordered_set<std::string_view> keys;
  keys.reserve(in_flight.size());
  for (const Event& e : in_flight) keys.insert(e.key);
  std::vector<bool> behind(next.size(), false);
  if (keys.empty()) return behind;
  for (std::size_t i = 0; i < next.size(); ++i) behind[i] = keys.contains(next[i].key);
  return behind;
}

}  // namespace outbox
