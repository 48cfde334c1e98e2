#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "sinks/envelope.hpp"

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
  Envelope envelope;  // format: json (the relay's records) or cloudevents (structured mode)
};

// type: stdout. JSON Lines on standard output, flushed per batch.
struct StdoutSinkConfig {
  Envelope envelope;
};

FileSinkConfig parse_file_sink(config::Section& section);
StdoutSinkConfig parse_stdout_sink(config::Section& section);
nlohmann::json describe_file_sink(const FileSinkConfig& config);
nlohmann::json describe_stdout_sink(const StdoutSinkConfig& config);

}  // namespace outbox::sinks
