#include "child.hpp"

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>

#include <cstring>
#include <stdexcept>
#include <thread>

extern char** environ;

namespace bench {

Child::Child(const std::vector<std::string>& argv, const std::string& stdout_path, const std::string& stderr_path) {
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
  posix_spawn_file_actions_addopen(&actions, 1, stdout_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  posix_spawn_file_actions_addopen(&actions, 2, stderr_path.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
  const int rc = posix_spawnp(&pid_, args[0], &actions, nullptr, args.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (rc != 0) throw std::runtime_error("spawn " + argv[0] + ": " + std::strerror(rc));
}

Child::~Child() {
  if (!reaped_) stop(std::chrono::milliseconds{5000});
}

void Child::reap(int status, const rusage& usage) {
  reaped_ = true;
  exit_.code = WIFEXITED(status) ? WEXITSTATUS(status) : WIFSIGNALED(status) ? -WTERMSIG(status) : -1;
  exit_.cpu_seconds = static_cast<double>(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec) +
                      static_cast<double>(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6;
}

bool Child::alive() {
  if (reaped_) return false;
  int status = 0;
  rusage usage{};
  if (wait4(pid_, &status, WNOHANG, &usage) == pid_) reap(status, usage);
  return !reaped_;
}

ChildExit Child::stop(std::chrono::milliseconds timeout) {
  if (!alive()) return exit_;
  ::kill(pid_, SIGTERM);
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (!alive()) return exit_;
    std::this_thread::sleep_for(std::chrono::milliseconds{5});
  }
  ::kill(pid_, SIGKILL);
  int status = 0;
  rusage usage{};
  if (wait4(pid_, &status, 0, &usage) == pid_) reap(status, usage);
  return exit_;
}

}  // namespace bench
