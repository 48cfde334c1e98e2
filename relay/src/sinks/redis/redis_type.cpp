// The registry row of the Redis Streams sink (sinks/registry.hpp).
#include "sinks/redis/redis_config.hpp"
#include "sinks/redis/redis_sink.hpp"
#include "sinks/registry.hpp"

namespace outbox::sinks {

SinkType redis_sink_type() { return sink_type<make_redis_sink>("redis", parse_redis_sink, describe_redis_sink); }

}  // namespace outbox::sinks
