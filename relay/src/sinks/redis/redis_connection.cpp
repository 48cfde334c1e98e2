#include "sinks/redis/redis_connection.hpp"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <deque>

#include "sinks/common/c_handle.hpp"

namespace outbox::sinks::redis {
namespace {

using SslCtxPtr = CHandle<SSL_CTX, &SSL_CTX_free>;
using SslPtr = CHandle<SSL, &SSL_free>;
using ReaderPtr = CHandle<redisReader, &redisReaderFree>;
using AddrPtr = CHandle<addrinfo, &freeaddrinfo>;

int remaining_ms(Clock::time_point deadline) {
  const auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<long long>(ms, 0, 600'000));
}

// Waits for fd to become ready for `events`. False on timeout or poll failure.
bool wait_fd(int fd, short events, Clock::time_point deadline) {
  for (;;) {
    pollfd p{fd, events, 0};
    const int rc = ::poll(&p, 1, remaining_ms(deadline));
    if (rc > 0) return true;
    if (rc == 0) return false;
    if (errno != EINTR) return false;
  }
}

}  // namespace

void append_command(std::string& out, const std::vector<std::string_view>& args) {
  // RESP, as redisFormatCommandArgv writes it, straight into `out` (no allocation per command).
  const auto append_number = [&out](std::size_t n) {
    char digits[24];
    const auto [end, ec] = std::to_chars(std::begin(digits), std::end(digits), n);
    out.append(digits, static_cast<std::size_t>(end - digits));
  };
  out += '*';
  append_number(args.size());
  out += "\r\n";
  for (const auto& a : args) {
    out += '$';
    append_number(a.size());
    out += "\r\n";
    out.append(a);
    out += "\r\n";
  }
}

struct Connection::Impl {
  int fd = -1;
  SslCtxPtr ctx;
  SslPtr ssl;
  ReaderPtr reader{redisReaderCreate()};
  bool broken = false;

  ~Impl() {
    if (ssl) SSL_shutdown(ssl.get());  // best effort close_notify; non-blocking
    ssl.reset();
    if (fd >= 0) ::close(fd);
  }

  // Non-blocking I/O. > 0: bytes; 0: would block; -1: error (text in error).
  // want_other is set when TLS needs the other direction before this one can go on.
  long io_write(const char* data, std::size_t n, bool& want_other, std::string& error) {
    want_other = false;
    if (!ssl) {
      const ssize_t w = ::send(fd, data, n, MSG_NOSIGNAL);
      if (w >= 0) return w;
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
      error = std::string("write failed: ") + std::strerror(errno);
      return -1;
    }
    ERR_clear_error();
    const int w = SSL_write(ssl.get(), data, static_cast<int>(std::min<std::size_t>(n, 1 << 30)));
    if (w > 0) return w;
    const int e = SSL_get_error(ssl.get(), w);
    if (e == SSL_ERROR_WANT_WRITE) return 0;
    if (e == SSL_ERROR_WANT_READ) {
      want_other = true;
      return 0;
    }
    error = "TLS write failed: " + (e == SSL_ERROR_SYSCALL ? std::string(std::strerror(errno)) : ssl_error_text());
    return -1;
  }

  // > 0: bytes; 0: would block; -1: error; -2: the server closed the connection.
  long io_read(char* buf, std::size_t n, bool& want_other, std::string& error) {
    want_other = false;
    if (!ssl) {
      const ssize_t r = ::recv(fd, buf, n, 0);
      if (r > 0) return r;
      if (r == 0) return -2;
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return 0;
      error = std::string("read failed: ") + std::strerror(errno);
      return -1;
    }
    ERR_clear_error();
    const int r = SSL_read(ssl.get(), buf, static_cast<int>(n));
    if (r > 0) return r;
    const int e = SSL_get_error(ssl.get(), r);
    if (e == SSL_ERROR_WANT_READ) return 0;
    if (e == SSL_ERROR_WANT_WRITE) {
      want_other = true;
      return 0;
    }
    if (e == SSL_ERROR_ZERO_RETURN || (e == SSL_ERROR_SYSCALL && ERR_peek_error() == 0 && errno == 0)) return -2;
    error = "TLS read failed: " + (e == SSL_ERROR_SYSCALL ? std::string(std::strerror(errno)) : ssl_error_text());
    return -1;
  }

  // Replies read but not yet handed out (receive()), and how many replies the commands sent so
  // far still owe: more than that is a protocol error.
  std::deque<ReplyPtr> arrived;
  std::size_t owed = 0;

  // Writes `commands` whole and reads until `need` replies have arrived, reading while it writes
  // so neither side's buffers can stall the other. False with `error` set (and the connection
  // broken) on a timeout, a lost connection or a protocol error.
  bool pump(std::string_view commands, std::size_t need, Clock::time_point deadline, std::string& error) {
    if (broken) {
      error = "connection already failed";
      return false;
    }
    std::size_t written = 0;
    bool write_wants_read = false, read_wants_write = false;
    char buf[64 * 1024];
    auto fail = [&](std::string why) {
      broken = true;
      error = std::move(why);
      return false;
    };
    while (written < commands.size() || arrived.size() < need) {
      // Write what the socket takes.
      while (written < commands.size()) {
        const long w = io_write(commands.data() + written, commands.size() - written, write_wants_read, error);
        if (w < 0) return fail(error);
        if (w == 0) break;
        written += static_cast<std::size_t>(w);
      }
      // Read what has arrived (TLS may hold decrypted bytes the socket no longer shows).
      for (;;) {
        const long r = io_read(buf, sizeof buf, read_wants_write, error);
        if (r == -2) {
          return fail("the server closed the connection (" + std::to_string(arrived.size()) + " of " +
                      std::to_string(need) + " replies read)");
        }
        if (r < 0) return fail(error);
        if (r == 0) break;
        if (redisReaderFeed(reader.get(), buf, static_cast<std::size_t>(r)) != REDIS_OK) {
          return fail(std::string("protocol error: ") + reader->errstr);
        }
        for (;;) {
          void* reply = nullptr;
          if (redisReaderGetReply(reader.get(), &reply) != REDIS_OK) {
            return fail(std::string("protocol error: ") + reader->errstr);
          }
          if (!reply) break;
          arrived.emplace_back(static_cast<redisReply*>(reply));
          if (arrived.size() > owed) return fail("more replies than commands: protocol out of step");
        }
      }
      if (written >= commands.size() && arrived.size() >= need) break;
      short events = POLLIN;
      if ((written < commands.size() && !write_wants_read) || read_wants_write) events |= POLLOUT;
      pollfd p{fd, events, 0};
      const int rc = ::poll(&p, 1, remaining_ms(deadline));
      if (rc < 0 && errno != EINTR) return fail(std::string("poll failed: ") + std::strerror(errno));
      if (rc == 0) {
        return fail("timed out (" + std::to_string(arrived.size()) + " of " + std::to_string(need) + " replies read, " +
                    std::to_string(written) + " of " + std::to_string(commands.size()) + " bytes sent)");
      }
    }
    return true;
  }

  bool send(std::string_view commands, std::size_t replies, Clock::time_point deadline, std::string& error) {
    owed += replies;
    return pump(commands, 0, deadline, error);
  }

  std::vector<ReplyPtr> receive(std::size_t count, Clock::time_point deadline, std::string& error) {
    std::vector<ReplyPtr> replies;
    const bool ok = pump({}, std::min(count, owed), deadline, error);
    const std::size_t n = std::min(count, arrived.size());
    replies.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      replies.push_back(std::move(arrived.front()));
      arrived.pop_front();
    }
    owed -= n;
    if (ok && n < count) error = "fewer replies owed than asked for: protocol out of step";
    return replies;
  }

  std::vector<ReplyPtr> roundtrip(std::string_view commands, std::size_t count, Clock::time_point deadline,
                                  std::string& error) {
    if (!send(commands, count, deadline, error)) return {};
    return receive(count, deadline, error);
  }

  // Non-blocking connect to one address. Empty string on success.
  std::string connect_to(const addrinfo& ai, Clock::time_point deadline) {
    fd = ::socket(ai.ai_family, ai.ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, ai.ai_protocol);
    if (fd < 0) return std::string("socket: ") + std::strerror(errno);
    if (::connect(fd, ai.ai_addr, ai.ai_addrlen) != 0) {
      if (errno != EINPROGRESS) return std::strerror(errno);
      if (!wait_fd(fd, POLLOUT, deadline)) return "connect timed out";
      int err = 0;
      socklen_t len = sizeof err;
      if (::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return std::strerror(errno);
      if (err != 0) return std::strerror(err);
    }
    const int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    ::setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
    return {};
  }

  std::string tls_handshake(const RedisSinkConfig& c, Clock::time_point deadline) {
    ctx.reset(SSL_CTX_new(TLS_client_method()));
    if (!ctx) return "TLS: " + ssl_error_text();
    if (auto error = configure_client_tls(ctx.get(), c.tls_files, c.host); !error.empty()) return error;
    ssl.reset(SSL_new(ctx.get()));
    if (!ssl) return "TLS: " + ssl_error_text();
    SSL_set_fd(ssl.get(), fd);
    if (!is_ip_literal(c.host)) SSL_set_tlsext_host_name(ssl.get(), c.host.c_str());
    for (;;) {
      ERR_clear_error();
      const int rc = SSL_connect(ssl.get());
      if (rc == 1) return {};
      const int e = SSL_get_error(ssl.get(), rc);
      short events = 0;
      if (e == SSL_ERROR_WANT_READ)
        events = POLLIN;
      else if (e == SSL_ERROR_WANT_WRITE)
        events = POLLOUT;
      else {
        const long verify = SSL_get_verify_result(ssl.get());
        std::string why = verify != X509_V_OK
                              ? std::string("certificate verification failed: ") + X509_verify_cert_error_string(verify)
                              : ssl_error_text();
        return "TLS handshake failed: " + why;
      }
      if (!wait_fd(fd, events, deadline)) return "TLS handshake timed out";
    }
  }
};

Connection::Connection(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Connection::~Connection() = default;

std::unique_ptr<Connection> Connection::open(const RedisSinkConfig& c, Clock::time_point deadline, std::string& error) {
  const std::string where =
      (c.host.find(':') != std::string::npos ? "[" + c.host + "]" : c.host) + ":" + std::to_string(c.port);
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const std::string port = std::to_string(c.port);
  if (const int rc = ::getaddrinfo(c.host.c_str(), port.c_str(), &hints, &found); rc != 0) {
    error = "cannot resolve " + c.host + ": " + gai_strerror(rc);
    return nullptr;
  }
  AddrPtr addresses(found);
  std::unique_ptr<Impl> impl;
  std::string last = "no address";
  for (const addrinfo* ai = addresses.get(); ai; ai = ai->ai_next) {
    impl = std::make_unique<Impl>();
    if (!impl->reader) throw std::bad_alloc();
    last = impl->connect_to(*ai, deadline);
    if (last.empty()) break;
    impl.reset();
  }
  if (!impl) {
    error = "cannot connect to " + where + ": " + last;
    return nullptr;
  }
  if (c.tls) {
    if (std::string why = impl->tls_handshake(c, deadline); !why.empty()) {
      error = where + ": " + why;
      return nullptr;
    }
  }
  // AUTH and SELECT in one round trip. Redis never echoes the password in its error replies.
  std::string hello;
  std::size_t expected = 0;
  if (!c.password.empty()) {
    if (c.username.empty())
      append_command(hello, {"AUTH", c.password});
    else
      append_command(hello, {"AUTH", c.username, c.password});
    ++expected;
  }
  const std::string db = std::to_string(c.db);
  if (c.db != 0) {
    append_command(hello, {"SELECT", db});
    ++expected;
  }
  append_command(hello, {"PING"});
  ++expected;
  std::string io_error;
  auto replies = impl->roundtrip(hello, expected, deadline, io_error);
  if (replies.size() < expected) {
    error = where + ": " + io_error;
    return nullptr;
  }
  for (const auto& r : replies) {
    if (r->type == REDIS_REPLY_ERROR) {
      error = where + ": " + std::string(r->str, r->len);
      return nullptr;
    }
  }
  return std::unique_ptr<Connection>(new Connection(std::move(impl)));
}

bool Connection::send(std::string_view commands, std::size_t replies, Clock::time_point deadline, std::string& error) {
  return impl_->send(commands, replies, deadline, error);
}

std::vector<ReplyPtr> Connection::receive(std::size_t count, Clock::time_point deadline, std::string& error) {
  return impl_->receive(count, deadline, error);
}

std::size_t Connection::owed() const { return impl_->owed; }

std::vector<ReplyPtr> Connection::roundtrip(std::string_view commands, std::size_t count, Clock::time_point deadline,
                                            std::string& error) {
  return impl_->roundtrip(commands, count, deadline, error);
}

}  // namespace outbox::sinks::redis
