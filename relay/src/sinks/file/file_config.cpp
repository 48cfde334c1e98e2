#include "sinks/file/file_config.hpp"

#include "config/section.hpp"

namespace outbox::sinks {

FileSinkConfig parse_file_sink(config::Section& section) {
  FileSinkConfig c;
  c.key_path = section.path();
  c.path = section.required_string("path");
  c.fsync = section.boolean_or("fsync", c.fsync);
  return c;
}

StdoutSinkConfig parse_stdout_sink(config::Section& /*section*/) { return {}; }

nlohmann::json describe_file_sink(const FileSinkConfig& config) {
  return {{"path", config.path}, {"fsync", config.fsync}};
}

nlohmann::json describe_stdout_sink(const StdoutSinkConfig& /*config*/) { return nlohmann::json::object(); }

}  // namespace outbox::sinks
