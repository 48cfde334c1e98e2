#include "sinks/rabbitmq/rabbitmq_confirms.hpp"

namespace outbox::sinks::rabbitmq {

std::uint64_t Confirms::add(Publish publish) {
  slots_.emplace_back(publish);
  ++outstanding_;
  return next_tag_++;
}

std::vector<Publish> Confirms::take_all() {
  std::vector<Publish> out;
  out.reserve(outstanding_);
  for (const auto& slot : slots_) {
    if (slot) out.push_back(*slot);
  }
  slots_.clear();
  first_tag_ = 1;
  next_tag_ = 1;
  outstanding_ = 0;
  return out;
}

}  // namespace outbox::sinks::rabbitmq
