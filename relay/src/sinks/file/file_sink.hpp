#pragma once
// JSON Lines sinks: one object per event, {"id","topic","key","payload","headers","created_at"}.
#include <memory>
#include <string>

#include "core/sink.hpp"
#include "sinks/envelope.hpp"
#include "sinks/file/file_config.hpp"

namespace outbox::sinks {

// Appends to a file and fsyncs before acknowledging. A failed write or fsync makes the whole batch
// retry (the file is truncated back to where the batch began) and the file is opened again for the
// next batch. Every open cuts an incomplete last line (a write torn by a crash, kill -9 included)
// before anything is appended, so each line of the file stays one whole JSON object. Every append
// and cut holds an exclusive flock(2) on the file, so relays sharing one file never cut a line
// another one is writing. One thread at a time.
// Opens (creates) the file. Throws config::ConfigError naming config.key_path + ".path" when it
// cannot be opened for appending (missing directory, not writable, a path under a file, ...):
// such a sink would only ever retry. Failures after start are retries, as for every sink.
std::unique_ptr<Sink> make_file_sink(std::string name, FileSinkConfig config);

// Writes to standard output, flushed per batch. One thread at a time.
std::unique_ptr<Sink> make_stdout_sink(std::string name, StdoutSinkConfig config);

}  // namespace outbox::sinks
