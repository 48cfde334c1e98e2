#include "postgres/listener.hpp"

#include <random>

#include "log/log.hpp"
#include "postgres/pooler.hpp"
#include "postgres/session.hpp"

namespace outbox::pg {
namespace {

class Receiver final : public pqxx::notification_receiver {
 public:
  Receiver(pqxx::connection_base& conn, const std::string& channel, Bell& bell)
      : pqxx::notification_receiver(conn, channel), bell_(bell) {}
  void operator()(const std::string& /*payload*/, int /*backend_pid*/) override { bell_.ring(WakeSource::kNotify); }

 private:
  Bell& bell_;
};

}  // namespace

Listener::Listener(std::string url, std::string channel, Bell& bell, Health& health, Metrics& metrics,
                   BackoffPolicy reconnect)
    : url_(std::move(url)),
      channel_(std::move(channel)),
      bell_(bell),
      health_(health),
      metrics_(metrics),
      reconnect_(reconnect) {}

Listener::~Listener() { join(); }

void Listener::join() {
  if (thread_.joinable()) thread_.join();
}

void Listener::start() { thread_ = std::thread([this] { run(); }); }

void Listener::run() {
  std::mt19937 rng{std::random_device{}()};
  std::uniform_real_distribution<double> jitter(0.0, 1.0);
  int failures = 0;
  while (!bell_.stopped()) {
    try {
      auto conn = open_session(url_, "listener");
      ensure_own_backend(*conn, url_);  // LISTEN on a pooled backend would hear nothing for us
      Receiver receiver(*conn, channel_, bell_);  // issues LISTEN, committed at once
      health_.listener_up = true;
      if (failures > 0) {
        metrics_.reconnected();
        log::info("LISTEN session restored", {{"channel", channel_}, {"after_attempts", failures}});
      } else {
        log::info("listening", {{"channel", channel_}});
      }
      failures = 0;
      bell_.ring(WakeSource::kStartup);  // catch up on whatever was committed before LISTEN
      while (!bell_.stopped()) {
        conn->await_notification(0, 200'000);  // returns early on a notification or stop check
      }
    } catch (const std::exception& e) {
      health_.listener_up = false;
      ++failures;
      const auto delay = backoff_delay(reconnect_, failures, jitter(rng));
      log::warn("LISTEN session lost, will reconnect",
                {{"error", describe_error(e)}, {"attempt", failures}, {"retry_in_ms", delay.count()}});
      bell_.sleep_until(std::chrono::steady_clock::now() + delay);
    }
  }
  health_.listener_up = false;
}

}  // namespace outbox::pg
