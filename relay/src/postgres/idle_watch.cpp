#include "postgres/idle_watch.hpp"

#include <algorithm>
#include <utility>

namespace outbox::pg {

WatchStatement watch_statement(std::chrono::milliseconds check, std::chrono::milliseconds length) {
  return {std::max(2, static_cast<int>(length / std::max(check, std::chrono::milliseconds{1}))),
          std::chrono::duration<double>(check).count()};
}

bool IdleWatch::looked(Time now, std::optional<std::string> sequence) {
  const bool say_why_not = !sequence && (sequence_ || !looked_at_);
  looked_at_ = now;
  sequence_ = std::move(sequence);
  return say_why_not;
}

}  // namespace outbox::pg
