#include "core/helper_thread.hpp"

#include <stdexcept>
#include <utility>

namespace outbox {

HelperThread::~HelperThread() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_one();
  if (thread_.joinable()) thread_.join();
}

std::future<void> HelperThread::run(std::function<void()> task) {
  std::packaged_task<void()> packaged(std::move(task));
  auto done = packaged.get_future();
  {
    std::lock_guard lock(mutex_);
    if (task_) throw std::logic_error("HelperThread::run: the previous task has not started yet");
    task_ = std::move(packaged);
    if (!thread_.joinable()) thread_ = std::thread([this] { serve(); });
  }
  wake_.notify_one();
  return done;
}

void HelperThread::serve() {
  for (;;) {
    std::packaged_task<void()> task;
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [this] { return stopping_ || task_; });
      if (!task_) return;  // stopping, nothing left to run
      task = std::move(*task_);
      task_.reset();
    }
    task();  // an exception goes into the task's future
  }
}

}  // namespace outbox
