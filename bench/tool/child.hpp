#pragma once
// A child process of the benchmark (the relay, or the peer's worker): spawned with its output in
// files, stopped with SIGTERM and, past a bound, SIGKILL. Not thread-safe; one owner.
#include <sys/resource.h>
#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

namespace bench {

struct ChildExit {
  int code = -1;           // exit code, or -signal when killed by a signal
  double cpu_seconds = 0;  // user + system time of the child, from wait4
};

class Child {
 public:
  // Spawns argv[0] (looked up in PATH) with stdout/stderr appended to the given files.
  // Throws std::runtime_error when the spawn fails.
  Child(const std::vector<std::string>& argv, const std::string& stdout_path, const std::string& stderr_path);
  ~Child();  // stops the child if it still runs
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;

  pid_t pid() const { return pid_; }
  // True while the child has not exited (reaps it when it has).
  bool alive();
  // SIGTERM, waits up to timeout, then SIGKILL. Idempotent: later calls return the first result.
  ChildExit stop(std::chrono::milliseconds timeout);

 private:
  void reap(int status, const rusage& usage);

  pid_t pid_ = -1;
  bool reaped_ = false;
  ChildExit exit_;
};

}  // namespace bench
