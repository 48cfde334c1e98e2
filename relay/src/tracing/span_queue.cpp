#include "tracing/span_queue.hpp"

#include <algorithm>
#include <iterator>

namespace outbox::tracing {

SpanQueue::SpanQueue(std::size_t capacity, std::size_t batch)
    : capacity_(capacity), batch_(std::max<std::size_t>(batch, 1)) {}

std::size_t SpanQueue::push(std::vector<SendSpan>& spans) {
  std::size_t dropped = 0;
  bool wake = false;
  {
    const std::lock_guard lock(mutex_);
    const std::size_t room = capacity_ - std::min(capacity_, spans_.size());
    const std::size_t taken = std::min(room, spans.size());
    dropped = spans.size() - taken;
    const auto end = spans.begin() + static_cast<std::ptrdiff_t>(taken);
    const std::size_t before = spans_.size();
    spans_.insert(spans_.end(), std::make_move_iterator(spans.begin()), std::make_move_iterator(end));
    wake = before < batch_ && spans_.size() >= batch_;  // only when a batch just filled up
  }
  spans.clear();
  if (wake) ready_.notify_one();
  return dropped;
}

bool SpanQueue::take(std::vector<SendSpan>& out, std::chrono::milliseconds wait) {
  out.clear();
  std::unique_lock lock(mutex_);
  ready_.wait_for(lock, wait, [this] { return stopped_ || spans_.size() >= batch_; });
  if (stopped_ && spans_.empty()) return false;
  const std::size_t n = std::min(batch_, spans_.size());
  const auto end = spans_.begin() + static_cast<std::ptrdiff_t>(n);
  out.assign(std::make_move_iterator(spans_.begin()), std::make_move_iterator(end));
  spans_.erase(spans_.begin(), end);
  return true;
}

void SpanQueue::stop() {
  {
    const std::lock_guard lock(mutex_);
    stopped_ = true;
  }
  ready_.notify_all();
}

bool SpanQueue::stopped() const {
  const std::lock_guard lock(mutex_);
  return stopped_;
}

std::size_t SpanQueue::size() const {
  const std::lock_guard lock(mutex_);
  return spans_.size();
}

}  // namespace outbox::tracing
