#pragma once
// One connection to a Redis server: TCP or TLS (OpenSSL), AUTH and SELECT on connect, and
// pipelined round trips with a deadline. hiredis formats the commands and parses the replies;
// the socket is ours (hiredis 0.14, Debian bookworm's, has no TLS and only per-call timeouts).
// Internal to sinks/redis/: the sink's public header does not include it.
#include <hiredis/hiredis.h>

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "sinks/common/c_handle.hpp"
#include "sinks/redis/redis_config.hpp"

namespace outbox::sinks::redis {

using Clock = std::chrono::steady_clock;

using ReplyPtr = CHandle<redisReply, &freeReplyObject>;

// Appends one command in RESP to out (what hiredis's redisFormatCommandArgv writes).
void append_command(std::string& out, const std::vector<std::string_view>& args);

class Connection {
 public:
  // Connects (every address of the host in turn), does the TLS handshake for rediss://, then AUTH
  // and SELECT as configured, all before deadline. Returns nullptr with `error` set on failure
  // (the text never holds the password). Blocking: name resolution is not bounded by the deadline.
  static std::unique_ptr<Connection> open(const RedisSinkConfig& config, Clock::time_point deadline,
                                          std::string& error);
  ~Connection();
  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // Writes `commands` (RESP) and reads `count` replies, reading while it writes so neither side's
  // buffers can stall the other. Returns the replies read: all of them, or fewer with `error` set
  // (timeout, connection lost, protocol error). After an error the connection is unusable.
  std::vector<ReplyPtr> roundtrip(std::string_view commands, std::size_t count, Clock::time_point deadline,
                                  std::string& error);

  // The two halves of roundtrip(), for commands pipelined behind others (Redis answers the
  // commands of one connection in order). send() writes `commands`, which owe `replies` replies,
  // and returns once they are written (replies that arrive meanwhile are kept); false with `error`
  // set on failure. receive() returns the next `count` replies in order: all of them, or fewer with
  // `error` set. After an error the connection is unusable.
  bool send(std::string_view commands, std::size_t replies, Clock::time_point deadline, std::string& error);
  std::vector<ReplyPtr> receive(std::size_t count, Clock::time_point deadline, std::string& error);
  // Replies owed by the commands sent and not yet handed out by receive().
  std::size_t owed() const;

 private:
  struct Impl;
  explicit Connection(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::sinks::redis
