#include "core/periodic_thread.hpp"

#include <stdexcept>
#include <utility>

namespace outbox {

PeriodicThread::~PeriodicThread() { stop(); }

void PeriodicThread::start(std::chrono::milliseconds interval, std::function<void()> tick) {
  std::lock_guard lock(mutex_);
  if (thread_.joinable() || stopping_) throw std::logic_error("PeriodicThread::start: started before");
  thread_ = std::thread([this, interval, tick = std::move(tick)] {
    std::unique_lock held(mutex_);
    for (;;) {
      if (wake_.wait_for(held, interval, [this] { return stopping_; })) return;
      held.unlock();
      tick();
      held.lock();
    }
  });
}

void PeriodicThread::stop() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace outbox
