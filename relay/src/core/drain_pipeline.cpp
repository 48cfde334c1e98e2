#include "core/drain_pipeline.hpp"

#include <utility>

namespace outbox {
namespace {

std::exception_ptr wait(std::future<void>& work) {
  if (!work.valid()) return nullptr;
  try {
    work.get();
    return nullptr;
  } catch (...) {
    return std::current_exception();
  }
}

}  // namespace

void DrainPipeline::start(std::function<void()> publish, bool publish_on_helper, std::function<void()> complete) {
  if (publish_on_helper) {
    publishing_ = publisher_.run(std::move(publish));
  } else {
    publish_here_ = std::move(publish);
  }
  if (complete) completing_ = completer_.run(std::move(complete));
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
  collected.complete_failure = wait(completing_);
  if (auto failure = wait(publishing_)) collected.publish_failure = failure;
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
