#pragma once
// JSON Lines sinks: one object per event, {"id","topic","key","payload","headers","created_at"}.
#include <atomic>
#include <memory>
#include <string>

#include "core/sink.hpp"
#include "sinks/file/file_config.hpp"

namespace outbox::sinks {

// Renders one event as a JSON Lines record (with the trailing newline) onto out.
void append_json_line(const Event& event, std::string& out);
// The record in the sink's format: append_json_line, or a structured CloudEvent.
void append_record(const Event& event, const Envelope& envelope, std::string& out);

// Appends to a file and fsyncs before acknowledging. A failed write or fsync makes the whole batch
// retry (the file is truncated back to where the batch began). One thread at a time.
class FileSink final : public Sink {
 public:
  FileSink(std::string name, FileSinkConfig config);
  ~FileSink() override;
  FileSink(const FileSink&) = delete;
  FileSink& operator=(const FileSink&) = delete;

  const std::string& name() const override { return name_; }
  std::vector<Outcome> publish(std::span<const Event* const> events) override;
  bool usable() const override;

 private:
  std::string name_;
  FileSinkConfig config_;
  int fd_ = -1;  // opened lazily, so a missing directory is a retry, not a crash
  std::atomic<bool> usable_{true};
  std::string buffer_;
};

// Writes to standard output, flushed per batch. One thread at a time.
class StdoutSink final : public Sink {
 public:
  explicit StdoutSink(std::string name, StdoutSinkConfig config = {})
      : name_(std::move(name)), config_(std::move(config)) {}
  const std::string& name() const override { return name_; }
  std::vector<Outcome> publish(std::span<const Event* const> events) override;

 private:
  std::string name_;
  StdoutSinkConfig config_;
  std::string buffer_;
};

}  // namespace outbox::sinks
