#include "http/server.hpp"

#include <httplib.h>
#include <sys/socket.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <thread>

#include "log/log.hpp"

namespace outbox::http {
namespace {

constexpr std::size_t kWorkers = 4;  // scrapes and probes are tiny; keep-alive holds a worker
constexpr const char* kMetricsType = "text/plain; version=0.0.4; charset=utf-8";
constexpr const char* kJsonType = "application/json";

// cpp-httplib's default also sets SO_REUSEPORT, which would let a second relay bind the same
// port and receive half of the probes meant for the first. Only SO_REUSEADDR here.
void socket_options(socket_t sock) {
  int yes = 1;
  setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
}

void answer(httplib::Response& res, const Readiness& r, const char* key) {
  res.status = r.ready ? 200 : 503;
  res.set_header("Cache-Control", "no-store");
  res.set_content(r.to_json(key), kJsonType);
}

}  // namespace

struct HttpServer::Impl {
  httplib::Server server;
  HttpHandlers handlers;
  std::string listen;
  int port = 0;
  std::thread thread;
  std::atomic<bool> finished{false};
};

HttpServer::HttpServer(const std::string& listen, HttpHandlers handlers) : impl_(std::make_unique<Impl>()) {
  auto& im = *impl_;
  im.handlers = std::move(handlers);
  im.listen = listen;
  const auto colon = listen.rfind(':');
  std::string host = listen.substr(0, colon);
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  const int port = std::stoi(listen.substr(colon + 1));

  im.server.new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  im.server.set_socket_options(socket_options);
  // An idle keep-alive connection holds a worker, and stop() waits for it: keep that short so
  // shutdown is not delayed by a scraper's open connection.
  im.server.set_keep_alive_timeout(1);
  im.server.set_read_timeout(std::chrono::seconds(5));
  im.server.set_write_timeout(std::chrono::seconds(5));
  im.server.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(impl_->handlers.metrics(), kMetricsType);
  });
  im.server.Get("/healthz", [this](const httplib::Request&, httplib::Response& res) {
    answer(res, impl_->handlers.liveness(), "alive");
  });
  im.server.Get("/readyz", [this](const httplib::Request&, httplib::Response& res) {
    answer(res, impl_->handlers.readiness(), "ready");
  });
  im.server.set_exception_handler(
      [](const httplib::Request& req, httplib::Response& res, const std::exception_ptr& ep) {
        std::string what = "unknown error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          what = e.what();
        } catch (...) {  // reported as a 500 and logged, never swallowed
        }
        log::warn("http handler failed", {{"path", req.path}, {"error", log::redact(what)}});
        res.status = 500;
        res.set_content(nlohmann::json{{"error", log::redact(what)}}.dump(), kJsonType);
      });

  errno = 0;
  if (port == 0) {
    im.port = im.server.bind_to_any_port(host);
    if (im.port <= 0) im.port = -1;
  } else {
    im.port = im.server.bind_to_port(host, port) ? port : -1;
  }
  if (im.port < 0) {
    const int err = errno;
    throw BindError("cannot listen on " + listen + (err ? std::string(": ") + std::strerror(err) : std::string()));
  }
}

HttpServer::~HttpServer() { stop(); }

int HttpServer::port() const { return impl_->port; }

void HttpServer::start() {
  auto& im = *impl_;
  im.thread = std::thread([&im] {
    if (!im.server.listen_after_bind()) log::warn("http server stopped accepting", {{"listen", im.listen}});
    im.finished = true;
  });
  log::info("http server listening",
            {{"listen", im.listen}, {"port", im.port}, {"paths", {"/metrics", "/healthz", "/readyz"}}});
}

void HttpServer::stop() {
  auto& im = *impl_;
  if (!im.thread.joinable()) return;
  // stop() is a no-op until the accept loop runs, so repeat until the thread has left it.
  while (!im.finished.load()) {
    if (im.server.is_running()) im.server.stop();
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  im.thread.join();
}

}  // namespace outbox::http
