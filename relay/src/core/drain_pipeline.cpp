#include "core/drain_pipeline.hpp"

#include <utility>

namespace outbox {

void DrainPipeline::start(std::function<void()> publish, bool publish_on_helper, std::function<void()> complete) {
  if (publish_on_helper) {
    publisher_.start(std::move(publish));
    publishing_ = true;
  } else {
    publish_here_ = std::move(publish);
  }
  if (complete) {
    completer_.start(std::move(complete));
    completing_ = true;
  }
}

DrainPipeline::Collected DrainPipeline::collect() {
  Collected collected;
  if (publish_here_) {
    try {
      publish_here_();
    } catch (...) {
      collected.publish_failure = std::current_exception();
    }
    publish_here_ = nullptr;
  }
  if (std::exchange(completing_, false)) collected.complete_failure = completer_.wait();
  if (std::exchange(publishing_, false)) {
    if (auto failure = publisher_.wait()) collected.publish_failure = failure;
  }
  return collected;
}

void DrainPipeline::claimed_ahead(KeyHolds failed) {
  held_ = failed;
  held_.merge(held_previous_);
  held_previous_ = std::move(failed);
}

void DrainPipeline::caught_up() {
  held_.clear();
  held_previous_.clear();
}

}  // namespace outbox
