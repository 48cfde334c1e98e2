#include "sinks/rabbitmq/rabbitmq_connection.hpp"

#include <amqp_framing.h>
#include <amqp_ssl_socket.h>
#include <amqp_tcp_socket.h>
#include <sys/socket.h>

#include <algorithm>
#include <new>

#include "sinks/rabbitmq/rabbitmq_outcomes.hpp"
#include "sinks/tls_client.hpp"

namespace outbox::sinks::rabbitmq {
namespace {

constexpr int kFrameMax = 131072;

}  // namespace

amqp_bytes_t bytes_of(const std::string& text) {
  // rabbitmq-c takes void* but only reads what it sends.
  return amqp_bytes_t{text.size(), const_cast<char*>(text.data())};
}

std::string string_of(amqp_bytes_t bytes) {
  return bytes.len == 0 ? std::string() : std::string(static_cast<const char*>(bytes.bytes), bytes.len);
}

timeval timeval_of(Clock::duration d) {
  const auto us = std::max<long long>(0, std::chrono::duration_cast<std::chrono::microseconds>(d).count());
  return timeval{static_cast<time_t>(us / 1'000'000), static_cast<suseconds_t>(us % 1'000'000)};
}

std::string reply_text(const amqp_rpc_reply_t& reply) {
  switch (reply.reply_type) {
    case AMQP_RESPONSE_NORMAL: return "ok";
    case AMQP_RESPONSE_NONE: return "no reply from the broker";
    case AMQP_RESPONSE_LIBRARY_EXCEPTION: return amqp_error_string2(reply.library_error);
    case AMQP_RESPONSE_SERVER_EXCEPTION:
      if (reply.reply.id == AMQP_CONNECTION_CLOSE_METHOD) {
        const auto* close = static_cast<const amqp_connection_close_t*>(reply.reply.decoded);
        return close_text("connection", close->reply_code, close->reply_text);
      }
      if (reply.reply.id == AMQP_CHANNEL_CLOSE_METHOD) {
        const auto* close = static_cast<const amqp_channel_close_t*>(reply.reply.decoded);
        return close_text("channel", close->reply_code, close->reply_text);
      }
      return std::string("unexpected method from the broker: ") + amqp_method_name(reply.reply.id);
  }
  return "unknown reply";
}

std::string close_text(const char* what, int code, amqp_bytes_t text) {
  return std::string(what) + " closed by the broker: " + amqp_reply_name(code) + " (" + std::to_string(code) +
         "): " + string_of(text);
}

// --- Watchdog ---

Watchdog::~Watchdog() {
  {
    std::lock_guard lock(mutex_);
    stopping_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

void Watchdog::arm(int fd, Clock::time_point deadline) {
  {
    std::lock_guard lock(mutex_);
    fd_ = fd;
    deadline_ = deadline;
    tripped_ = false;
  }
  wake_.notify_all();
}

bool Watchdog::disarm() {
  std::lock_guard lock(mutex_);
  fd_ = -1;
  return tripped_;
}

void Watchdog::run() {
  std::unique_lock lock(mutex_);
  while (!stopping_) {
    if (fd_ < 0) {
      wake_.wait(lock);
      continue;
    }
    if (Clock::now() >= deadline_) {
      ::shutdown(fd_, SHUT_RDWR);
      tripped_ = true;
      fd_ = -1;
      continue;
    }
    wake_.wait_until(lock, deadline_);
  }
}

// --- Connection ---

std::unique_ptr<Connection> Connection::open(const RabbitmqSinkConfig& config, const std::string& sink_name,
                                             Watchdog& watchdog, Clock::time_point deadline, std::string& error) {
  std::unique_ptr<Connection> c(new Connection());
  c->state_.reset(amqp_new_connection());
  if (!c->state_) throw std::bad_alloc();
  // Owned by the connection.
  amqp_socket_t* socket = config.tls ? amqp_ssl_socket_new(c->state()) : amqp_tcp_socket_new(c->state());
  if (!socket) {
    error = "cannot create a socket";
  } else if (config.tls) {
    // Our context checks the chain and the host name (DNS names and IP literals), so the
    // handshake fails on a bad certificate; rabbitmq-c's own checks after it would repeat ours
    // (and its name check knows DNS names only).
    error = configure_client_tls(static_cast<SSL_CTX*>(amqp_ssl_socket_get_context(socket)), config.tls_files,
                                 config.host, &c->tls_verify_error_);
    amqp_ssl_socket_set_verify_peer(socket, 0);
    amqp_ssl_socket_set_verify_hostname(socket, 0);
  }
  if (socket && error.empty()) {
    timeval tv = timeval_of(deadline - Clock::now());
    const int rc = amqp_socket_open_noblock(socket, config.host.c_str(), config.port, &tv);
    if (rc != AMQP_STATUS_OK) {
      error = "cannot connect to " + config.host + ":" + std::to_string(config.port) + ": " + amqp_error_string2(rc);
      if (!c->tls_verify_error_.empty()) error += ": certificate verification failed: " + c->tls_verify_error_;
    } else {
      error = c->handshake(config, sink_name, watchdog, deadline);
    }
  }
  if (!error.empty()) return nullptr;
  return c;
}

std::string Connection::handshake(const RabbitmqSinkConfig& config, const std::string& sink_name, Watchdog& watchdog,
                                  Clock::time_point deadline) {
  amqp_connection_state_t c = state();
  timeval tv = timeval_of(deadline - Clock::now());
  amqp_set_handshake_timeout(c, &tv);
  amqp_set_rpc_timeout(c, &tv);
  watchdog.arm(fd(), deadline + kWatchdogGrace);

  const std::string connection_name = "outbox-relay " + sink_name;
  amqp_table_entry_t entry{};
  entry.key = amqp_cstring_bytes("connection_name");
  entry.value.kind = AMQP_FIELD_KIND_UTF8;
  entry.value.value.bytes = bytes_of(connection_name);
  amqp_table_t properties{1, &entry};
  // Heartbeats off: rabbitmq-c answers them only inside its calls. A dead broker is noticed by
  // the keeper (a closed socket) or by the batch deadline (no confirms), then reconnected.
  amqp_rpc_reply_t reply =
      amqp_login_with_properties(c, config.vhost.c_str(), 0, kFrameMax, 0, &properties, AMQP_SASL_METHOD_PLAIN,
                                 config.user.c_str(), config.password.c_str());
  std::string error;
  if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
    error = "login to vhost '" + config.vhost + "' as '" + config.user + "' failed: " + reply_text(reply);
  } else {
    amqp_channel_open(c, kChannel);
    reply = amqp_get_rpc_reply(c);
    if (reply.reply_type != AMQP_RESPONSE_NORMAL) {
      error = "channel.open failed: " + reply_text(reply);
    } else {
      amqp_confirm_select(c, kChannel);
      reply = amqp_get_rpc_reply(c);
      if (reply.reply_type != AMQP_RESPONSE_NORMAL) error = "confirm.select failed: " + reply_text(reply);
    }
  }
  if (watchdog.disarm() && error.empty()) error = "the handshake did not finish within timeout";
  return error;
}

Connection::~Connection() = default;

int Connection::fd() const { return amqp_get_sockfd(state()); }

void Connection::close_gracefully(Watchdog& watchdog, Clock::duration timeout) {
  timeval tv = timeval_of(std::min<Clock::duration>(timeout, std::chrono::milliseconds{1000}));
  amqp_set_rpc_timeout(state(), &tv);
  watchdog.arm(fd(), Clock::now() + timeout);
  amqp_channel_close(state(), kChannel, AMQP_REPLY_SUCCESS);
  amqp_connection_close(state(), AMQP_REPLY_SUCCESS);
  watchdog.disarm();
}

std::optional<std::string> Connection::idle_check() {
  amqp_frame_t frame;
  timeval zero{0, 0};
  const int rc = amqp_simple_wait_frame_noblock(state(), &frame, &zero);
  if (rc == AMQP_STATUS_TIMEOUT) return std::nullopt;
  if (rc != AMQP_STATUS_OK) return std::string("connection lost while idle: ") + amqp_error_string2(rc);
  if (frame.frame_type == AMQP_FRAME_METHOD && (frame.payload.method.id == AMQP_CONNECTION_CLOSE_METHOD ||
                                                frame.payload.method.id == AMQP_CHANNEL_CLOSE_METHOD)) {
    return std::string("closed by the broker while idle: ") + amqp_method_name(frame.payload.method.id);
  }
  amqp_maybe_release_buffers(state());
  return std::nullopt;
}

}  // namespace outbox::sinks::rabbitmq
