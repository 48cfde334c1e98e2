#include "core/bell.hpp"

namespace outbox {

void Bell::ring(WakeSource source) {
  {
    std::lock_guard lock(mutex_);
    if (!rung_) rung_ = source;
  }
  cv_.notify_all();
}

void Bell::stop() {
  {
    std::lock_guard lock(mutex_);
    stopped_ = true;
  }
  cv_.notify_all();
}

bool Bell::stopped() const {
  std::lock_guard lock(mutex_);
  return stopped_;
}

std::optional<WakeSource> Bell::wait_until(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  cv_.wait_until(lock, deadline, [&] { return stopped_ || rung_.has_value(); });
  if (stopped_) return std::nullopt;
  auto source = rung_;
  rung_.reset();
  return source;
}

bool Bell::sleep_until(std::chrono::steady_clock::time_point deadline) {
  std::unique_lock lock(mutex_);
  cv_.wait_until(lock, deadline, [&] { return stopped_; });
  return !stopped_;
}

void Bell::clear() {
  std::lock_guard lock(mutex_);
  rung_.reset();
}

}  // namespace outbox
