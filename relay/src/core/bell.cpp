#include "core/bell.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cstdint>
#include <system_error>

namespace outbox {

Bell::Bell() : fd_(::eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) {
  if (fd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

Bell::~Bell() { ::close(fd_); }

void Bell::signal_watcher() {
  const std::uint64_t one = 1;
  [[maybe_unused]] const auto n = ::write(fd_, &one, sizeof one);  // full counter: already readable
}

void Bell::drain_watcher_fd() {
  std::uint64_t count = 0;
  [[maybe_unused]] const auto n = ::read(fd_, &count, sizeof count);  // EAGAIN: nothing to drain
}

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
  signal_watcher();
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

bool Bell::offer_watch(long long after) {
  {
    std::lock_guard lock(mutex_);
    if (!watcher_) {
      watch_after_.reset();
      return false;
    }
    if (watch_after_ == after) return true;  // the watcher has it already
    watch_after_ = after;
  }
  signal_watcher();
  return true;
}

void Bell::withdraw_watch() {
  std::lock_guard lock(mutex_);
  watch_after_.reset();
}

void Bell::set_watcher(bool available) {
  std::lock_guard lock(mutex_);
  watcher_ = available;
  if (!available) watch_after_.reset();
}

std::optional<long long> Bell::watch_offer() const {
  std::lock_guard lock(mutex_);
  return watch_after_;
}

void Bell::ring_watch(long long after) {
  {
    std::lock_guard lock(mutex_);
    if (watch_after_ != after) return;
    watch_after_.reset();
    if (!rung_) rung_ = WakeSource::kWatch;
  }
  cv_.notify_all();
}

}  // namespace outbox
