#include "sinks/common/batch_log.hpp"

#include "log/log.hpp"

namespace outbox::sinks {

BatchSummary BatchSummary::of(std::span<const Outcome> outcomes) {
  BatchSummary s;
  for (const auto& o : outcomes) {
    switch (o.kind) {
      case OutcomeKind::kDelivered: ++s.delivered; break;
      case OutcomeKind::kRetry: ++s.retry; break;
      case OutcomeKind::kPermanent: ++s.permanent; break;
      case OutcomeKind::kDeferred: ++s.deferred; break;
    }
    const bool failed = o.kind == OutcomeKind::kRetry || o.kind == OutcomeKind::kPermanent;
    if (!s.first_failure && failed) s.first_failure = &o;
  }
  return s;
}

bool log_batch(std::string_view type, const std::string& sink, std::span<const Outcome> outcomes,
               const nlohmann::json& extra) {
  const BatchSummary s = BatchSummary::of(outcomes);
  if (!s.first_failure) return false;
  nlohmann::json fields = {{"sink", sink},           {"delivered", s.delivered},
                           {"retry", s.retry},       {"permanent", s.permanent},
                           {"deferred", s.deferred}, {"first_error", s.first_failure->reason}};
  fields.update(extra);
  log::warn(std::string(type) + " batch not fully delivered", std::move(fields));
  return true;
}

}  // namespace outbox::sinks
