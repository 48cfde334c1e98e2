#pragma once
// The dedicated LISTEN session: its own thread and connection, LISTEN and nothing else.
// Order at start and after every reconnect: LISTEN (autocommit), then ring the bell so the loop
// catches up from the table. A notification only rings the bell; it carries no data.
// Reconnects through core/reconnect.hpp, like the work session.
#include <memory>
#include <string>
#include <thread>

#include "core/backoff.hpp"
#include "core/bell.hpp"
#include "core/clock.hpp"
#include "core/health.hpp"
#include "core/metrics.hpp"

namespace outbox::pg {

class Listener {
 public:
  // Everything is borrowed and must outlive the listener; the clock is read on its thread.
  Listener(std::string url, std::string channel, Bell& bell, Health& health, Metrics& metrics,
           BackoffPolicy reconnect, const Clock& clock);
  ~Listener();  // joins; the thread ends once the bell is stopped
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  void start();
  // Waits for the thread, which ends once the bell is stopped.
  void join();

 private:
  void run();

  std::string url_;
  std::string channel_;
  Bell& bell_;
  Health& health_;
  Metrics& metrics_;
  BackoffPolicy reconnect_;
  const Clock& clock_;
  std::thread thread_;
};

}  // namespace outbox::pg
