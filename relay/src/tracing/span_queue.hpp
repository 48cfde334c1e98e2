#pragma once
// The bounded queue between the loop, which hands spans in, and the exporter's thread, which takes
// them out in batches. Pure: no I/O, tested on its own (tests/unit/tracing).
//
// Never blocking the loop: push() takes the mutex for a few moves of the spans it hands in; the
// consumer holds it only to move at most one batch out (no I/O, no encoding under it). A full queue
// drops the newest spans and says how many: the loop never waits for room.
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

#include "core/tracing.hpp"

namespace outbox::tracing {

class SpanQueue {
 public:
  // capacity: at most this many spans wait (tracing.queue_size); batch: take() wakes when this
  // many wait (tracing.batch_size).
  SpanQueue(std::size_t capacity, std::size_t batch);
  SpanQueue(const SpanQueue&) = delete;
  SpanQueue& operator=(const SpanQueue&) = delete;

  // Moves what fits of `spans` in (all of it is consumed); returns how many did not fit.
  std::size_t push(std::vector<SendSpan>& spans);
  // Waits until a batch is queued, `wait` passed or stop() was called, then moves up to one batch
  // into `out` (cleared first). Returns false once stopped with nothing left.
  bool take(std::vector<SendSpan>& out, std::chrono::milliseconds wait);
  // take() no longer waits; what is queued can still be taken.
  void stop();
  bool stopped() const;
  std::size_t size() const;

 private:
  const std::size_t capacity_;
  const std::size_t batch_;
  mutable std::mutex mutex_;
  std::condition_variable ready_;
  std::deque<SendSpan> spans_;  // guarded by mutex_
  bool stopped_ = false;        // guarded by mutex_
};

}  // namespace outbox::tracing
