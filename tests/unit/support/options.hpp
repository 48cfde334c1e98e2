#pragma once
// Test support: the option structs of the loop and the runner as the relay builds them
// (app/options.hpp) from a config with every default (config/config.hpp); a test then sets what
// it is about.
#include "app/options.hpp"
#include "config/config.hpp"

namespace outbox::testing {

inline LoopOptions default_loop_options() { return app::loop_options(config::Config{}); }
inline RunnerOptions default_runner_options() { return app::runner_options(config::Config{}); }

// The loop's options with the limits most tests are about.
inline LoopOptions loop_options(std::size_t batch_size, int max_attempts, BackoffPolicy backoff) {
  LoopOptions o = default_loop_options();
  o.batch_size = batch_size;
  o.max_attempts = max_attempts;
  o.backoff = backoff;
  return o;
}

}  // namespace outbox::testing
