#pragma once
// The dedicated LISTEN session: its own thread and connection. It LISTENs, and watches the id
// sequence for an idle relay.
// Order at start and after every reconnect: LISTEN (autocommit), then ring the bell so the loop
// catches up from the table. A notification only rings the bell; it carries no data. Rings for
// notifications are paced (postgres/notify_pacer.hpp): any role may send them.
// The idle watch: while the loop offers it (Waiter::offer_watch), this session runs one statement
// of about `watch.length` that reads the table's id sequence every `watch.check` (the backend
// sleeps in between) and returns once an id above the offer was drawn; the thread then rings
// kWatch. Notifications that arrive meanwhile are handled when the statement returns. No watch
// when the table has an enabled trigger that notifies (its writers ring the bell themselves,
// within a millisecond) or the role cannot read the sequence.
// A notification whose payload is exactly `reload` (`outbox-relay reload`) calls on_reload instead
// of ringing, paced the same way with a pacer of its own (the app raises SIGHUP: app/reload.hpp).
// Reconnects through core/reconnect.hpp, like the work session.
#include <chrono>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "core/backoff.hpp"
#include "core/bell.hpp"
#include "core/clock.hpp"
#include "core/health.hpp"
#include "core/metrics.hpp"
#include "core/reconnect.hpp"
#include "postgres/idle_watch.hpp"

namespace pqxx {
class connection_base;
}

namespace outbox::pg {

// No defaults here: config/config.hpp holds them, app/options.hpp builds these from a Config.
struct WatchOptions {
  bool enabled;
  std::string table;
  std::chrono::milliseconds check;   // between two reads of the sequence
  std::chrono::milliseconds length;  // of one watch statement
  // At most one ring for notifications per this long (NotifyPacer): any role may NOTIFY.
  std::chrono::milliseconds notify_every;
};

class Listener {
 public:
  // Everything is borrowed and must outlive the listener; the clock is read on its thread.
  Listener(std::string url, std::string channel, Bell& bell, Health& health, Metrics& metrics, BackoffPolicy reconnect,
           const Clock& clock, WatchOptions watch);
  ~Listener();  // joins; the thread ends once the bell is stopped
  Listener(const Listener&) = delete;
  Listener& operator=(const Listener&) = delete;

  // Called on the LISTEN thread for a `reload` notification (paced). Set before start().
  void on_reload(std::function<void()> callback) { on_reload_ = std::move(callback); }

  void start();
  // After the bell is stopped: cancels a watch statement in progress (from a thread of its own, as
  // a cancel request opens a connection), so the thread ends now rather than with the statement.
  void interrupt();
  // Waits for the thread, which ends once the bell is stopped.
  void join();
  // Waits for the thread until deadline; false if it has not ended (a session that does not
  // answer): the caller may leave without it.
  bool join_until(std::chrono::steady_clock::time_point deadline);

 private:
  void run();
  void session(Reconnect& reconnect, const WatchStatement& statement);

  std::string url_;
  std::string channel_;
  Bell& bell_;
  Health& health_;
  Metrics& metrics_;
  BackoffPolicy reconnect_;
  const Clock& clock_;
  WatchOptions watch_;
  std::function<void()> on_reload_ = [] {};
  std::thread thread_;
  std::promise<void> ended_;
  std::future<void> ended_future_ = ended_.get_future();
  std::thread canceller_;
  std::mutex watching_mutex_;
  pqxx::connection_base* watching_ = nullptr;  // the session while a watch statement runs
};

}  // namespace outbox::pg
