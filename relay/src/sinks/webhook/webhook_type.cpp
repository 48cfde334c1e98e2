// The registry row of the webhook sink (sinks/registry.hpp).
#include "sinks/registry.hpp"
#include "sinks/webhook/webhook_config.hpp"
#include "sinks/webhook/webhook_sink.hpp"

namespace outbox::sinks {

SinkType webhook_sink_type() {
  return sink_type<make_webhook_sink>("webhook", parse_webhook_sink, describe_webhook_sink);
}

}  // namespace outbox::sinks
