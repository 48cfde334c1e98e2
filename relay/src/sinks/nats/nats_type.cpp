// The registry row of the NATS JetStream sink (sinks/registry.hpp).
#include "sinks/nats/nats_config.hpp"
#include "sinks/nats/nats_sink.hpp"
#include "sinks/registry.hpp"

namespace outbox::sinks {

SinkType nats_sink_type() { return sink_type<make_nats_sink>("nats", parse_nats_sink, describe_nats_sink); }

}  // namespace outbox::sinks
