#pragma once
// One AMQP 0-9-1 connection to a RabbitMQ broker (rabbitmq-c): TCP or TLS, login, and one channel
// in confirm mode, each step bounded by a deadline; and the watchdog that bounds every blocking
// call on its socket. The sink (rabbitmq_sink.cpp) publishes on it and keeps the state across
// reconnects. Internal to sinks/rabbitmq/: the sink's public header does not include it.
#include <amqp.h>

#include <chrono>
#include <condition_variable>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "sinks/common/c_handle.hpp"
#include "sinks/rabbitmq/rabbitmq_config.hpp"

namespace outbox::sinks::rabbitmq {

using Clock = std::chrono::steady_clock;

inline constexpr amqp_channel_t kChannel = 1;  // the one channel the sink publishes on
// Our own waits end at the deadline; the watchdog shuts a socket down this long after it.
inline constexpr std::chrono::milliseconds kWatchdogGrace{250};

// rabbitmq-c takes void* but only reads what it sends.
amqp_bytes_t bytes_of(const std::string& text);
std::string string_of(amqp_bytes_t bytes);
timeval timeval_of(Clock::duration d);
// What an RPC reply says, for last_error and the log.
std::string reply_text(const amqp_rpc_reply_t& reply);
// "<what> closed by the broker: NO_ROUTE (312): <text>", for a channel.close or connection.close.
std::string close_text(const char* what, int code, amqp_bytes_t text);

// Shuts a socket down when a call on it outlives its deadline, so that no rabbitmq-c call (a
// send into a broker that stopped reading, a read of a returned message) blocks a batch for
// longer than the sink's timeout. The blocked call then fails and the connection is replaced.
// Owns its thread; arm() and disarm() are called by the thread that uses the socket, which
// closes the socket only after disarm(): shutdown() never touches a closed descriptor.
class Watchdog {
 public:
  Watchdog() : thread_([this] { run(); }) {}
  ~Watchdog();
  Watchdog(const Watchdog&) = delete;
  Watchdog& operator=(const Watchdog&) = delete;

  void arm(int fd, Clock::time_point deadline);
  // Returns whether it shut the socket down.
  bool disarm();

 private:
  void run();

  std::mutex mutex_;
  std::condition_variable wake_;
  int fd_ = -1;
  Clock::time_point deadline_{};
  bool tripped_ = false;
  bool stopping_ = false;
  std::thread thread_;  // last: started after the fields it reads
};

// One connection. Not thread-safe: its owner uses it from one thread at a time (the sink, under
// its mutex).
class Connection {
 public:
  // Connects to config.host:port (TLS when config.tls, our context verifying the broker), logs in
  // as config.user to config.vhost, opens kChannel and selects confirm mode, all before deadline;
  // watchdog shuts the socket down if a call outlives it. nullptr with `error` set on failure (the
  // text never holds the password). sink_name names the connection in the broker's UI.
  static std::unique_ptr<Connection> open(const RabbitmqSinkConfig& config, const std::string& sink_name,
                                          Watchdog& watchdog, Clock::time_point deadline, std::string& error);
  // Destroys the connection and closes the socket at once (no close handshake); publishes not yet
  // confirmed are the owner's to retry.
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // For rabbitmq-c's calls (publish, frames): valid while this object lives.
  amqp_connection_state_t state() const { return state_.get(); }
  int fd() const;

  // Closes the channel and the connection with the broker, waiting at most min(timeout, 1 s) for
  // each answer and timeout in all (the watchdog).
  void close_gracefully(Watchdog& watchdog, Clock::duration timeout);

  // Between batches, without waiting: why the connection is gone (a closed socket, or the broker's
  // connection.close or channel.close waiting to be read), or nullopt while it is up.
  std::optional<std::string> idle_check();

 private:
  Connection() = default;
  // Login, channel.open and confirm.select, each bounded by the deadline. Returns an error or "".
  std::string handshake(const RabbitmqSinkConfig& config, const std::string& sink_name, Watchdog& watchdog,
                        Clock::time_point deadline);

  // The TLS handshake's certificate check failure (configure_client_tls keeps a pointer to it in
  // the connection's SSL context). Declared before state_, so it outlives the context.
  std::string tls_verify_error_;
  CHandle<amqp_connection_state_t_, &amqp_destroy_connection> state_;
};

}  // namespace outbox::sinks::rabbitmq
