#include "core/reconnect.hpp"

#include "core/store.hpp"
#include "log/log.hpp"

namespace outbox {

std::chrono::milliseconds reconnect_delay(const BackoffPolicy& policy, int failures, DbErrorClass kind,
                                          double jitter01) {
  // 63 doublings reach any cap: backoff_delay then returns the cap with equal jitter.
  return backoff_delay(policy, needs_operator(kind) ? 63 : failures, jitter01);
}

Reconnect::Reconnect(SessionTexts texts, BackoffPolicy policy, Waiter& waiter, const Clock& clock, Metrics& metrics,
                     std::atomic<bool>& up, std::atomic<DbErrorClass>& error, std::function<double()> jitter01)
    : texts_(texts),
      policy_(policy),
      waiter_(waiter),
      clock_(clock),
      metrics_(metrics),
      up_(up),
      error_(error),
      jitter01_(std::move(jitter01)) {}

int Reconnect::connected() {
  up_ = true;
  const int before = failures_;
  if (before > 0) {
    metrics_.reconnected();
    log::info(texts_.restored, {{"session", texts_.session}, {"after_attempts", before}});
  }
  failures_ = 0;
  return before;
}

void Reconnect::run(const std::function<void()>& session) {
  while (!waiter_.stopped()) {
    try {
      session();
    } catch (const StoreUnavailable& e) {
      up_ = false;
      error_ = e.kind();
      ++failures_;
      metrics_.db_error(e.kind());
      const auto delay = reconnect_delay(policy_, failures_, e.kind(), jitter01_());
      nlohmann::json fields{{"session", texts_.session},
                            {"class", db_error_label(e.kind())},
                            {"error", e.what()},
                            {"attempt", failures_},
                            {"retry_in_ms", delay.count()}};
      if (needs_operator(e.kind())) {
        fields["hint"] = e.hint();
        log::error("database refuses the relay, an operator has to act", std::move(fields));
      } else {
        log::warn(texts_.lost, std::move(fields));
      }
      if (!waiter_.sleep_until(clock_.now() + delay)) break;
    }
  }
}

}  // namespace outbox
