#include "core/helper_thread.hpp"

#include <stdexcept>
#include <utility>

namespace outbox {

HelperThread::~HelperThread() {
  {
    std::unique_lock lock(mutex_);
    changed_.wait(lock, [this] { return !running_; });
    stopping_ = true;
  }
  changed_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HelperThread::start(std::function<void()> task) {
  {
    std::lock_guard lock(mutex_);
    if (running_) throw std::logic_error("HelperThread::start: the previous task is still running");
    task_ = std::move(task);
    running_ = true;
    failure_ = nullptr;
    if (!thread_.joinable()) thread_ = std::thread([this] { serve(); });
  }
  changed_.notify_all();
}

std::exception_ptr HelperThread::wait() {
  std::unique_lock lock(mutex_);
  changed_.wait(lock, [this] { return !running_; });
  return std::exchange(failure_, nullptr);
}

void HelperThread::serve() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mutex_);
      changed_.wait(lock, [this] { return stopping_ || task_; });
      if (!task_) return;  // stopping, nothing left to run
      task = std::exchange(task_, nullptr);
    }
    std::exception_ptr failure;
    try {
      task();
    } catch (...) {
      failure = std::current_exception();
    }
    task = nullptr;  // what the task captured goes away before the owner hears it finished
    {
      std::lock_guard lock(mutex_);
      failure_ = std::move(failure);
      running_ = false;
    }
    changed_.notify_all();
  }
}

}  // namespace outbox
