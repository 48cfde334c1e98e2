#pragma once
#include <chrono>
#include <optional>

namespace outbox {

// No defaults here: config/config.hpp holds each policy's (relay.backoff, database.reconnect).
struct BackoffPolicy {
  std::chrono::milliseconds initial;
  std::chrono::milliseconds max;
};

// Delay before the next attempt after `attempts` failed attempts (attempts >= 1):
// initial * 2^(attempts-1), capped at max, with "equal jitter": half fixed, half scaled by
// jitter01 in [0, 1). A downstream's Retry-After raises the delay to at least that much, still
// capped at max. Pure: the caller supplies the random number.
std::chrono::milliseconds backoff_delay(const BackoffPolicy& policy, int attempts, double jitter01,
                                        std::optional<std::chrono::milliseconds> retry_after = {});

}  // namespace outbox
