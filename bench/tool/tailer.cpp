#include "tailer.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sys/inotify.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <stdexcept>

namespace bench {

Tailer::Tailer(std::string path, LineFn on_line) : path_(std::move(path)), on_line_(std::move(on_line)) {
  file_fd_ = ::open(path_.c_str(), O_RDONLY | O_CLOEXEC);
  if (file_fd_ < 0) throw std::runtime_error("open " + path_ + ": " + std::strerror(errno));
  inotify_fd_ = ::inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
  if (inotify_fd_ < 0 || ::inotify_add_watch(inotify_fd_, path_.c_str(), IN_MODIFY) < 0) {
    const int err = errno;
    ::close(file_fd_);
    if (inotify_fd_ >= 0) ::close(inotify_fd_);
    throw std::runtime_error("inotify " + path_ + ": " + std::strerror(err));
  }
  thread_ = std::thread([this] { run(); });
}

Tailer::~Tailer() {
  stop();
  ::close(inotify_fd_);
  ::close(file_fd_);
}

void Tailer::stop() {
  stop_ = true;
  if (thread_.joinable()) thread_.join();
}

void Tailer::read_available() {
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(file_fd_, buf, sizeof buf);
    if (n <= 0) return;  // 0: caught up with the writer
    const auto seen = Steady::now();
    std::string_view chunk(buf, static_cast<std::size_t>(n));
    for (;;) {
      const auto nl = chunk.find('\n');
      if (nl == std::string_view::npos) {
        partial_.append(chunk);
        break;
      }
      if (partial_.empty()) {
        on_line_(chunk.substr(0, nl), seen);
      } else {
        partial_.append(chunk.substr(0, nl));
        on_line_(partial_, seen);
        partial_.clear();
      }
      lines_.fetch_add(1, std::memory_order_relaxed);
      chunk.remove_prefix(nl + 1);
    }
  }
}

void Tailer::run() {
  char events[4096];
  while (!stop_.load()) {
    pollfd p{inotify_fd_, POLLIN, 0};
    ::poll(&p, 1, 20);  // the timeout only bounds how late a stop() is noticed
    while (::read(inotify_fd_, events, sizeof events) > 0) {
    }
    read_available();
  }
  read_available();
}

}  // namespace bench
