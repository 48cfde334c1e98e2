#pragma once
// The publishes on the sink's confirm-mode channel the broker has not confirmed yet, by delivery
// tag: a pure bookkeeping of the sink's (rabbitmq_sink.cpp), kept apart so it is unit-tested. The
// broker numbers a channel's publishes 1, 2, 3, ... and answers each with basic.ack or basic.nack,
// for one tag or (multiple) for every tag up to it; with two submissions on the channel at once
// (Sink::submit()), the publishes of both interleave in that numbering.
#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>
#include <vector>

namespace outbox::sinks::rabbitmq {

// What one publish carried: the event at `index` of submission `submission`.
struct Publish {
  std::uint64_t submission = 0;
  std::size_t index = 0;
  bool operator==(const Publish&) const = default;
};

class Confirms {
 public:
  // The publish about to be sent gets the next tag (the first on a channel is 1). Returns it.
  std::uint64_t add(Publish publish);

  // basic.ack or basic.nack of `tag` (multiple: of every unconfirmed tag up to it). Calls
  // on_confirmed(Publish) for each publish it confirms, in tag order; tags not outstanding
  // (answered before, or never sent on this channel) are ignored. Returns how many it confirmed.
  template <class F>
  std::size_t confirm(std::uint64_t tag, bool multiple, F&& on_confirmed) {
    if (tag < first_tag_ || tag >= next_tag_) return 0;
    const auto last = static_cast<std::size_t>(tag - first_tag_);
    std::size_t done = 0;
    for (std::size_t j = multiple ? 0 : last; j <= last; ++j) {
      if (!slots_[j]) continue;
      const Publish p = *slots_[j];
      slots_[j].reset();
      --outstanding_;
      ++done;
      on_confirmed(p);
    }
    while (!slots_.empty() && !slots_.front()) {
      slots_.pop_front();
      ++first_tag_;
    }
    return done;
  }

  // The channel is gone: every unconfirmed publish, in tag order; the next channel starts at 1.
  std::vector<Publish> take_all();

  std::size_t outstanding() const { return outstanding_; }

 private:
  std::deque<std::optional<Publish>> slots_;  // slots_[j]: tag first_tag_ + j; empty once confirmed
  std::uint64_t first_tag_ = 1;
  std::uint64_t next_tag_ = 1;
  std::size_t outstanding_ = 0;
};

}  // namespace outbox::sinks::rabbitmq
