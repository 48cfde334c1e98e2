#include "sinks/file/file_sink.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <nlohmann/json.hpp>

#include "log/log.hpp"

namespace outbox::sinks {
namespace {

void append_json_string(const std::string& text, std::string& out) {
  out += nlohmann::json(text).dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

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

}  // namespace

void append_json_line(const Event& e, std::string& out) {
  out += "{\"id\":";
  out += std::to_string(e.id);
  out += ",\"topic\":";
  append_json_string(e.topic, out);
  out += ",\"key\":";
  append_json_string(e.key, out);
  out += ",\"payload\":";
  out += e.payload;  // already JSON text from Postgres
  out += ",\"headers\":";
  out += e.headers_json.empty() ? "{}" : e.headers_json;
  out += ",\"created_at\":\"";
  out += e.created_at;
  out += "\"}\n";
}

void append_record(const Event& event, const Envelope& envelope, std::string& out) {
  if (envelope.format == EnvelopeFormat::kCloudEvents) {
    append_structured_cloudevent(event, envelope, out);
  } else {
    append_json_line(event, out);
  }
}

FileSink::FileSink(std::string name, FileSinkConfig config)
    : name_(std::move(name)), config_(std::move(config)) {}

FileSink::~FileSink() {
  if (fd_ >= 0) ::close(fd_);
}

bool FileSink::usable() const { return usable_.load(); }

std::vector<Outcome> FileSink::publish(std::span<const Event* const> events) {
  auto fail_all = [&](std::string reason) {
    usable_ = false;
    log::warn("file sink write failed", {{"sink", name_}, {"path", config_.path}, {"error", reason}});
    if (fd_ >= 0) {
      ::close(fd_);  // reopen next time: the file may have been moved or its disk replaced
      fd_ = -1;
    }
    return std::vector<Outcome>(events.size(), Outcome::retry(reason));
  };

  if (fd_ < 0) {
    fd_ = ::open(config_.path.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0640);
    if (fd_ < 0) return fail_all(errno_text(("open " + config_.path).c_str(), errno));
  }
  buffer_.clear();
  for (const Event* e : events) append_record(*e, config_.envelope, buffer_);

  struct stat st {};
  const off_t before = ::fstat(fd_, &st) == 0 ? st.st_size : -1;
  if (const int err = write_all(fd_, buffer_)) {
    if (before >= 0 && ::ftruncate(fd_, before) != 0) {
      log::warn("file sink could not truncate a partial write", {{"sink", name_}, {"error", std::strerror(errno)}});
    }
    return fail_all(errno_text("write", err));
  }
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

}  // namespace outbox::sinks
