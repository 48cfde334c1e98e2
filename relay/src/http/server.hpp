#pragma once
// The relay's small HTTP server: /metrics, /healthz, /readyz. cpp-httplib stays inside the .cpp.
//
// Threading: the constructor binds on the calling thread; start() serves on a background
// thread with a small worker pool; handlers run on those workers and must be thread-safe.
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

#include "http/readiness.hpp"

namespace outbox::http {

struct HttpHandlers {
  std::function<std::string()> metrics;  // Prometheus text exposition
  std::function<Readiness()> liveness;   // /healthz: 200 when live, else 503
  std::function<Readiness()> readiness;  // /readyz: 200 when ready, else 503
};

// The listen address could not be bound (in use, no such interface, bad host).
class BindError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class HttpServer {
 public:
  // Binds listen ("host:port" or "[v6]:port"; port 0 picks a free one). Throws BindError.
  // Does not accept connections before start().
  HttpServer(const std::string& listen, HttpHandlers handlers);
  ~HttpServer();  // stop()
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  void start();
  // Stops accepting, lets the workers finish and joins. Idempotent. Blocks briefly.
  void stop();
  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace outbox::http
