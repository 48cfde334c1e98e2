#pragma once
// How often the LISTEN session's notifications ring the bell. Any role may NOTIFY the relay's
// channel (Postgres has no privilege for it), and each ring makes the loop drain from the start.
// The first notification after a quiet `every` rings at once (an operator's command, the opt-in
// push trigger: no added latency); after it, at most one ring per `every`, however many arrive
// (issue 43: a writer sending 10,000 a second kept the relay draining, a quarter of a core, with
// nothing to publish). Pure: time comes in as arguments.
#include <chrono>
#include <optional>

namespace outbox::pg {

class NotifyPacer {
 public:
  using Time = std::chrono::steady_clock::time_point;

  explicit NotifyPacer(std::chrono::milliseconds every) : every_(every) {}

  // Notifications arrived at `now`: whether to ring now. If not, a ring is held until due().
  bool arrived(Time now) {
    if (!rang_before_ || now - rang_ >= every_) {
      rang_before_ = true;
      rang_ = now;
      held_ = false;
      return true;
    }
    held_ = true;
    return false;
  }
  // When the ring held back is due, if one is.
  std::optional<Time> due() const { return held_ ? std::optional<Time>(rang_ + every_) : std::nullopt; }
  // Whether the ring held back is due at `now` (it is then rung: nothing is held any more).
  bool take_due(Time now) {
    if (!held_ || now < rang_ + every_) return false;
    rang_ = now;
    held_ = false;
    return true;
  }

 private:
  std::chrono::milliseconds every_;
  Time rang_{};  // the last ring, if rang_before_
  bool rang_before_ = false;
  bool held_ = false;  // notifications arrived after rang_ and wait for a ring
};

}  // namespace outbox::pg
