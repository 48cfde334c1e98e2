#pragma once
#include <string>

namespace outbox::config {
class Section;
}

namespace outbox::sinks {

// type: file. JSON Lines appended to path; fsynced before events count as delivered.
struct FileSinkConfig {
  std::string path;
  bool fsync = true;  // false only for benchmarks of the rest of the pipeline
  // The config path of this sink (e.g. "sinks[1]"), for startup errors that name the key.
  std::string key_path;
};

// type: stdout. JSON Lines on standard output, flushed per batch.
struct StdoutSinkConfig {};

FileSinkConfig parse_file_sink(config::Section& section);
StdoutSinkConfig parse_stdout_sink(config::Section& section);

}  // namespace outbox::sinks
