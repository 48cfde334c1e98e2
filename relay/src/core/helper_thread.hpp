#pragma once
// One long-lived thread that runs one task at a time for its owner (the pipelined drain: a
// batch's sinks, a batch's outcomes). Starting a thread per batch cost more than a short batch's
// work; this one starts with the first task and lives until its owner is destroyed.
//
// The task, its exception and its end are handed over under one mutex (no std::future): the
// exception object is created on the helper and released by the owner after wait(), so every
// access to it is ordered by that mutex (ThreadSanitizer checks this in the test command).
#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace outbox {

class HelperThread {
 public:
  HelperThread() = default;
  // Waits for the task in flight, if any, then joins the thread.
  ~HelperThread();
  HelperThread(const HelperThread&) = delete;
  HelperThread& operator=(const HelperThread&) = delete;

  // Runs `task` on the helper thread. One task at a time: wait() for the previous one first.
  void start(std::function<void()> task);
  // Waits for the task started last; returns what it threw (nullptr: it returned, or no task).
  std::exception_ptr wait();

 private:
  void serve();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::function<void()> task_;  // set: waiting for the helper to take it
  bool running_ = false;        // started and not yet finished
  std::exception_ptr failure_;  // of the task that finished last
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace outbox
