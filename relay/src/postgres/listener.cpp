#include "postgres/listener.hpp"

#include <random>

#include "core/reconnect.hpp"
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
                   BackoffPolicy reconnect, const Clock& clock)
    : url_(std::move(url)),
      channel_(std::move(channel)),
      bell_(bell),
      health_(health),
      metrics_(metrics),
      reconnect_(reconnect),
      clock_(clock) {}

Listener::~Listener() { join(); }

void Listener::join() {
  if (thread_.joinable()) thread_.join();
}

void Listener::start() { thread_ = std::thread([this] { run(); }); }

void Listener::run() {
  std::mt19937 rng{std::random_device{}()};
  std::uniform_real_distribution<double> jitter(0.0, 1.0);
  const HintContext hints{url_user(url_), {}};
  Reconnect reconnect({"listener", "LISTEN session lost, will reconnect", "LISTEN session restored"}, reconnect_,
                      bell_, clock_, metrics_, health_.listener_up, health_.listener_error,
                      [&] { return jitter(rng); });
  reconnect.run([&] {
    translate_errors("LISTEN session", [&] {
      auto conn = open_session(url_, "listener");
      ensure_own_backend(*conn, url_);  // LISTEN on a pooled backend would hear nothing for us
      Receiver receiver(*conn, channel_, bell_);  // issues LISTEN, committed at once
      if (reconnect.connected() == 0) log::info("listening", {{"channel", channel_}});
      bell_.ring(WakeSource::kStartup);  // catch up on whatever was committed before LISTEN
      while (!bell_.stopped()) {
        conn->await_notification(0, 200'000);  // returns early on a notification or stop check
      }
    }, hints);
  });
  health_.listener_up = false;
}

}  // namespace outbox::pg
