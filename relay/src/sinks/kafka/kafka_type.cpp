// The registry row of the Kafka sink (sinks/registry.hpp).
#include "sinks/kafka/kafka_config.hpp"
#include "sinks/kafka/kafka_sink.hpp"
#include "sinks/registry.hpp"

namespace outbox::sinks {

SinkType kafka_sink_type() { return sink_type<make_kafka_sink>("kafka", parse_kafka_sink, describe_kafka_sink); }

}  // namespace outbox::sinks
