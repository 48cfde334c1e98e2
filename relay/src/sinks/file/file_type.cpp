// The registry rows of the file and stdout sinks (sinks/registry.hpp).
#include "sinks/file/file_config.hpp"
#include "sinks/file/file_sink.hpp"
#include "sinks/registry.hpp"

namespace outbox::sinks {

SinkType file_sink_type() { return sink_type<make_file_sink>("file", parse_file_sink, describe_file_sink); }

SinkType stdout_sink_type() { return sink_type<make_stdout_sink>("stdout", parse_stdout_sink, describe_stdout_sink); }

}  // namespace outbox::sinks
