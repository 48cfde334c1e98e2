#include "sinks/file/file_sink.hpp"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdio>
#include <cstring>

#include "config/section.hpp"
#include "log/log.hpp"

namespace outbox::sinks {
namespace {

std::string errno_text(const char* what, int err) { return std::string(what) + ": " + std::strerror(err); }

// Writes all of data, retrying short writes and EINTR. Returns 0 or an errno value.
int write_all(int fd, const std::string& data) {
  std::size_t done = 0;
  while (done < data.size()) {
    const ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

// Reads exactly len bytes at offset, retrying short reads and EINTR. Returns 0 or an errno value.
int read_all_at(int fd, char* data, std::size_t len, off_t offset) {
  std::size_t done = 0;
  while (done < len) {
    const ssize_t n = ::pread(fd, data + done, len - done, offset + static_cast<off_t>(done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    if (n == 0) return EIO;  // the file shrank under us: someone else is cutting it
    done += static_cast<std::size_t>(n);
  }
  return 0;
}

// An exclusive flock(2) on an open file for the life of this object. Appends and cuts hold it, so
// a relay opening a file that another live relay appends to never cuts a line still being
// written. Without flock support (some network file systems) it holds nothing; a lone relay
// does not need it.
class FileLock {
 public:
  explicit FileLock(int fd) : fd_(fd) {
    int rc = 0;
    do {
      rc = ::flock(fd_, LOCK_EX);
    } while (rc != 0 && errno == EINTR);
    locked_ = rc == 0;
  }
  ~FileLock() {
    if (locked_) ::flock(fd_, LOCK_UN);
  }
  FileLock(const FileLock&) = delete;
  FileLock& operator=(const FileLock&) = delete;

 private:
  int fd_;
  bool locked_ = false;
};

struct Cut {
  off_t bytes = 0;  // cut off the end of the file
  int error = 0;    // errno of a failed read or truncate; nothing was cut then
};

// Cuts what follows the last '\n' of a regular file: the start of a line whose write was torn (a
// relay killed inside write(2), a disk that filled up). Appending after such a fragment would glue
// it to the next record, and that line would parse as nothing. The caller holds the FileLock.
Cut cut_incomplete_last_line(int fd) {
  struct stat st {};
  if (::fstat(fd, &st) != 0) return {0, errno};
  if (!S_ISREG(st.st_mode) || st.st_size == 0) return {};
  char chunk[16 * 1024];
  off_t end = st.st_size;
  off_t keep = 0;  // stays 0 if the file holds no '\n' at all: all of it is one torn line
  while (end > 0) {
    const off_t begin = std::max<off_t>(0, end - static_cast<off_t>(sizeof chunk));
    const auto len = static_cast<std::size_t>(end - begin);
    if (const int err = read_all_at(fd, chunk, len, begin)) return {0, err};
    if (const void* newline = ::memrchr(chunk, '\n', len)) {
      keep = begin + (static_cast<const char*>(newline) - chunk) + 1;
      break;
    }
    end = begin;
  }
  if (keep == st.st_size) return {};
  if (::ftruncate(fd, keep) != 0) return {0, errno};
  return {st.st_size - keep, 0};
}

// The sink make_file_sink() builds (file_sink.hpp).
class FileSink final : public NamedSink {
 public:
  FileSink(std::string name, FileSinkConfig config);
  ~FileSink() override;

  std::vector<Outcome> publish(std::span<const Event* const> events) override;
  bool usable() const override;
  const char* messaging_system() const override { return "file"; }

 private:
  // Opens config_.path into fd_ and cuts an incomplete last line. Returns 0 or an errno value
  // (fd_ stays -1 then).
  int open_file();

  FileSinkConfig config_;
  int fd_ = -1;  // open from the constructor on; after a failure, reopened by the next publish()
  std::atomic<bool> usable_{true};
  std::string buffer_;
};

// The sink make_stdout_sink() builds (file_sink.hpp).
class StdoutSink final : public NamedSink {
 public:
  StdoutSink(std::string name, StdoutSinkConfig config) : NamedSink(std::move(name)), config_(std::move(config)) {}
  const char* messaging_system() const override { return "stdout"; }
  std::vector<Outcome> publish(std::span<const Event* const> events) override;

 private:
  StdoutSinkConfig config_;
  std::string buffer_;
};

}  // namespace

FileSink::FileSink(std::string name, FileSinkConfig config) : NamedSink(std::move(name)), config_(std::move(config)) {
  if (const int err = open_file()) {
    const std::string key = (config_.key_path.empty() ? "sink '" + this->name() + "'" : config_.key_path) + ".path";
    throw config::ConfigError(key + ": cannot open " + config_.path + " for appending: " + std::strerror(err));
  }
}

FileSink::~FileSink() {
  if (fd_ >= 0) ::close(fd_);
}

bool FileSink::usable() const { return usable_.load(); }

int FileSink::open_file() {
  int fd = ::open(config_.path.c_str(), O_RDWR | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  // Reading only serves the cut below: a file the relay may append to but not read still works.
  if (fd < 0 && errno == EACCES) fd = ::open(config_.path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
  if (fd < 0) return errno;
  fd_ = fd;
  const FileLock lock(fd_);
  const Cut cut = cut_incomplete_last_line(fd_);
  if (cut.error != 0) {
    log::warn("file sink could not check the file for an incomplete last line; appending anyway",
              {{"sink", name()}, {"path", config_.path}, {"error", std::strerror(cut.error)}});
  } else if (cut.bytes > 0) {
    log::warn("file sink cut an incomplete last line (a torn write) before appending",
              {{"sink", name()}, {"path", config_.path}, {"bytes_cut", static_cast<long long>(cut.bytes)}});
  }
  return 0;
}

std::vector<Outcome> FileSink::publish(std::span<const Event* const> events) {
  auto fail_all = [&](std::string reason) {
    usable_ = false;
    log::warn("file sink write failed", {{"sink", name()}, {"path", config_.path}, {"error", reason}});
    if (fd_ >= 0) {
      ::close(fd_);  // reopen next time: the file may have been moved or its disk replaced
      fd_ = -1;
    }
    return std::vector<Outcome>(events.size(), Outcome::retry(reason));
  };

  if (fd_ < 0) {
    if (const int err = open_file()) return fail_all(errno_text(("open " + config_.path).c_str(), err));
  }
  buffer_.clear();
  for (const Event* e : events) append_record(*e, config_.envelope, buffer_);

  std::string write_error;
  {
    const FileLock lock(fd_);  // released before fail_all closes fd_
    struct stat st {};
    const bool regular = ::fstat(fd_, &st) == 0 && S_ISREG(st.st_mode);
    if (const int err = write_all(fd_, buffer_)) {
      if (regular && ::ftruncate(fd_, st.st_size) != 0) {
        log::warn("file sink could not truncate a partial write", {{"sink", name()}, {"error", std::strerror(errno)}});
      }
      write_error = errno_text("write", err);
    }
  }
  if (!write_error.empty()) return fail_all(write_error);
  if (config_.fsync && ::fdatasync(fd_) != 0) return fail_all(errno_text("fdatasync", errno));
  usable_ = true;
  return std::vector<Outcome>(events.size(), Outcome::delivered());
}

std::vector<Outcome> StdoutSink::publish(std::span<const Event* const> events) {
  buffer_.clear();
  for (const Event* e : events) append_record(*e, config_.envelope, buffer_);
  const bool ok = std::fwrite(buffer_.data(), 1, buffer_.size(), stdout) == buffer_.size() && std::fflush(stdout) == 0;
  if (!ok) return std::vector<Outcome>(events.size(), Outcome::retry(errno_text("write stdout", errno)));
  return std::vector<Outcome>(events.size(), Outcome::delivered());
}

std::unique_ptr<Sink> make_file_sink(std::string name, FileSinkConfig config) {
  return std::make_unique<FileSink>(std::move(name), std::move(config));
}

std::unique_ptr<Sink> make_stdout_sink(std::string name, StdoutSinkConfig config) {
  return std::make_unique<StdoutSink>(std::move(name), std::move(config));
}

}  // namespace outbox::sinks
