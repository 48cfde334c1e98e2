#pragma once
// The {topic} placeholder of the sinks' destination templates: the Kafka topic, the NATS subject,
// the Redis stream. Each sink's config checks its own template; rendering is the same for all.
#include <string>

namespace outbox::sinks {

// `text` with every "{topic}" replaced by `topic` (a "{topic}" inside the topic is not replaced).
std::string render_topic_template(const std::string& text, const std::string& topic);

}  // namespace outbox::sinks
