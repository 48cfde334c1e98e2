// The registry row of the RabbitMQ sink (sinks/registry.hpp).
#include "sinks/rabbitmq/rabbitmq_config.hpp"
#include "sinks/rabbitmq/rabbitmq_sink.hpp"
#include "sinks/registry.hpp"

namespace outbox::sinks {

SinkType rabbitmq_sink_type() {
  return sink_type<make_rabbitmq_sink>("rabbitmq", parse_rabbitmq_sink, describe_rabbitmq_sink);
}

}  // namespace outbox::sinks
