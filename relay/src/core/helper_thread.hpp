#pragma once
// One long-lived thread that runs one task at a time for its owner (the pipelined drain: a
// batch's sinks, a batch's outcomes). Starting a thread per batch cost more than a short batch's
// work; this one starts with the first task and lives until its owner is destroyed.
#include <condition_variable>
#include <functional>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

namespace outbox {

class HelperThread {
 public:
  HelperThread() = default;
  // Waits for the task in flight, if any, then joins the thread.
  ~HelperThread();
  HelperThread(const HelperThread&) = delete;
  HelperThread& operator=(const HelperThread&) = delete;

  // Runs `task` on the helper thread; the future carries its exception. One task at a time: the
  // caller waits for the previous future before it submits the next task.
  std::future<void> run(std::function<void()> task);

 private:
  void serve();

  std::mutex mutex_;
  std::condition_variable wake_;
  std::optional<std::packaged_task<void()>> task_;
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace outbox
