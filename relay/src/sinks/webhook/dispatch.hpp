#pragma once
// Which event of a batch may be sent next. Pure state machine, no I/O: the sink drives it and
// tests drive it directly.
//   - Events of one key go one after another, in the order given (the loop passes id order).
//   - Different keys run concurrently; keys start in order of their first event, and a key whose
//     event succeeded goes to the back of the queue, so one busy key cannot starve the others.
//   - After an event of a key ends with `hold_key` (a retry), the later events of that key are
//     held back (core/key_holds.hpp): unsent() reports them as blocked and the sink answers
//     kDeferred for them.
//     A permanent failure does not hold the key: that event is dead-lettered, and the claim's
//     head-of-line rule lets the later events of its key pass a dead-lettered one too.
#include <cstddef>
#include <deque>
#include <optional>
#include <span>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "core/event.hpp"
#include "core/key_holds.hpp"

namespace outbox::sinks::webhook {

class KeyedDispatch {
 public:
  // Borrows the events (their keys) for the lifetime of this object.
  explicit KeyedDispatch(std::span<const Event* const> events);

  // The index of an event that may be sent now, or nullopt when every key is in flight, held
  // or finished. Each index is handed out at most once.
  std::optional<std::size_t> next();

  // The event at `index` (handed out by next()) has ended. `hold_key`: hold back the rest of its key.
  void finish(std::size_t index, bool hold_key);

  std::size_t in_flight() const { return in_flight_; }
  // Whether next() would hand out an event now.
  bool ready() const { return !ready_.empty(); }

  struct Unsent {
    std::size_t index;
    bool blocked;  // true: held back behind a failed event of its key; false: not reached
  };
  // Events next() never handed out, in index order.
  std::vector<Unsent> unsent() const;

 private:
  struct Lane {
    std::vector<std::size_t> events;  // indices in order
    std::size_t sent = 0;             // events[0, sent) were handed out
    bool busy = false;
  };

  std::span<const Event* const> events_;
  KeyHolds held_;
  std::vector<Lane> lanes_;
  std::vector<std::size_t> lane_of_;  // event index -> lane
  std::deque<std::size_t> ready_;     // lanes that may start their next event
  std::size_t in_flight_ = 0;
};

}  // namespace outbox::sinks::webhook
