#include "core/backoff.hpp"

#include <algorithm>
#include <cmath>

namespace outbox {

std::chrono::milliseconds backoff_delay(const BackoffPolicy& policy, int attempts, double jitter01,
                                        std::optional<std::chrono::milliseconds> retry_after) {
  using std::chrono::milliseconds;
  const double cap = static_cast<double>(std::max(policy.max.count(), policy.initial.count()));
  const int exponent = std::clamp(attempts - 1, 0, 62);
  const double full = std::min(cap, static_cast<double>(policy.initial.count()) * std::ldexp(1.0, exponent));
  const double jitter = std::clamp(jitter01, 0.0, 1.0);
  auto delay = milliseconds(static_cast<long long>(full / 2 + full / 2 * jitter));
  if (retry_after) {
    delay = std::max(delay, std::min(*retry_after, milliseconds(static_cast<long long>(cap))));
  }
  return delay;
}

}  // namespace outbox
