#pragma once
#include <memory>

#include "config/config.hpp"
#include "core/sink.hpp"

namespace outbox::sinks {

// Builds the sink a config entry describes. Throws config::ConfigError (naming the key) when the
// sink cannot be created at startup.
std::unique_ptr<Sink> make_sink(const config::SinkConfig& config);

}  // namespace outbox::sinks
