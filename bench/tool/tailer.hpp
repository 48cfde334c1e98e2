#pragma once
// Follows a file another process appends to (the relay's file sink, the peer's task log) with
// inotify, on its own thread, and hands every complete line to a callback together with the
// monotonic time at which the line was read. Reading is passive: it adds no load to the writer.
#include <atomic>
#include <chrono>
#include <functional>
#include <string>
#include <string_view>
#include <thread>

namespace bench {

using Steady = std::chrono::steady_clock;

class Tailer {
 public:
  // Called on the tailer thread, in file order, without the trailing newline.
  using LineFn = std::function<void(std::string_view line, Steady::time_point seen)>;

  // path must exist. Starts the thread at once. Throws std::runtime_error on open/inotify errors.
  Tailer(std::string path, LineFn on_line);
  ~Tailer();  // stops and joins
  Tailer(const Tailer&) = delete;
  Tailer& operator=(const Tailer&) = delete;

  void stop();
  // Complete lines seen so far (any thread).
  long long lines() const { return lines_.load(); }

 private:
  void run();
  void read_available();

  std::string path_;
  LineFn on_line_;
  int file_fd_ = -1;
  int inotify_fd_ = -1;
  std::atomic<bool> stop_{false};
  std::atomic<long long> lines_{0};
  std::string partial_;
  std::thread thread_;
};

}  // namespace bench
