#include "sinks/redis/redis_sink.hpp"

#include <atomic>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/periodic_thread.hpp"
#include "log/log.hpp"
#include "sinks/common/batch_log.hpp"
#include "sinks/redis/redis_connection.hpp"
#include "sinks/redis/redis_outcomes.hpp"

namespace outbox::sinks {
namespace {

using redis::Clock;
using redis::ReplyPtr;
using std::chrono::milliseconds;

constexpr milliseconds kPingInterval{1000};  // the helper thread's beat
constexpr milliseconds kMaxPingWait{1000};   // the helper's PING or connect waits at most this (or timeout)

std::string reply_text(const redisReply& r) { return std::string(r.str ? r.str : "", r.str ? r.len : 0); }

// The outcome of an error reply to one event's XADD.
Outcome error_outcome(const std::string& error, const std::string& stream) {
  std::string reason = error + " (stream " + stream + ")";
  switch (classify_redis_error(redis_error_code(error))) {
    case RedisErrorClass::kPermanent: return Outcome::permanent(std::move(reason));
    case RedisErrorClass::kRetry: return Outcome::retry(std::move(reason));
  }
  return Outcome::retry(std::move(reason));
}

std::string headers_json(const Event& event) {
  nlohmann::json headers = nlohmann::json::object();
  for (const auto& [name, value] : event.headers) headers[name] = value;
  return headers.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// The sink redis_sink.hpp describes (file-local; make_redis_sink() starts its helper thread).
struct RedisSink final : public NamedSink {
  RedisSink(std::string sink_name, RedisSinkConfig sink_config)
      : NamedSink(std::move(sink_name)),
        config(std::move(sink_config)),
        maxlen(config.maxlen ? std::to_string(*config.maxlen) : "") {}

  // Not a value of OpenTelemetry's list: the sink type.
  const char* messaging_system() const override { return "redis"; }
  std::string destination(const Event& event) const override { return render_stream(config.stream, event.topic); }

  const RedisSinkConfig config;
  const std::string maxlen;

  // Held by publish() and by the helper thread while it uses the connection.
  std::mutex mutex;
  std::unique_ptr<redis::Connection> connection;  // null: not connected
  Clock::time_point last_used{};

  std::atomic<bool> up{false};  // usable()

  // Connects and PINGs between batches (beat). Last: stopped before anything it uses goes away.
  PeriodicThread helper;

  void set_up(bool now_up, const std::string& why) {
    const bool was = up.exchange(now_up);
    if (was && !now_up) log::warn("redis connection lost", {{"sink", name()}, {"error", why}});
  }

  // Under mutex. False with error set when no connection can be made before deadline.
  bool ensure_connected(Clock::time_point deadline, std::string& error) {
    if (connection) return true;
    connection = redis::Connection::open(config, deadline, error);
    if (!connection) {
      set_up(false, error);
      return false;
    }
    last_used = Clock::now();
    if (!up.exchange(true)) log::info("redis connected", {{"sink", name()}, {"url", config.url_for_logs}});
    return true;
  }

  void drop_connection(const std::string& why) {
    connection.reset();
    set_up(false, why);
  }

  // The helper thread's tick: connects while nobody publishes, and PINGs an idle connection, so
  // usable() tells the truth between batches and a dead connection is noticed before a batch.
  void beat() {
    std::unique_lock lock(mutex);
    if (Clock::now() - last_used < kPingInterval && connection) return;
    std::string error;
    // Short, so that ~RedisSink (which stops this thread) waits at most about kMaxPingWait.
    const auto deadline = Clock::now() + std::min(config.timeout, kMaxPingWait);
    if (!connection) {
      // Connecting can take up to timeout: do it without the lock, so a batch is not held up.
      lock.unlock();
      auto fresh = redis::Connection::open(config, deadline, error);
      lock.lock();
      if (fresh && !connection) {
        connection = std::move(fresh);
        last_used = Clock::now();
        if (!up.exchange(true)) log::info("redis connected", {{"sink", name()}, {"url", config.url_for_logs}});
      } else if (!fresh) {
        set_up(false, error);
      }
      return;
    }
    std::string ping;
    redis::append_command(ping, {"PING"});
    auto replies = connection->roundtrip(ping, 1, deadline, error);
    if (replies.size() != 1 || replies[0]->type == REDIS_REPLY_ERROR) {
      drop_connection(replies.empty() ? error : reply_text(*replies[0]));
    } else {
      last_used = Clock::now();
      up = true;
    }
  }

  // One MULTI/XADD.../EXEC round trip for the events at `todo` (indices into events, id order).
  // Decides results[i] for every i in todo, except events that must be sent again at once
  // (returned): when EXEC was refused only because some XADDs were permanently refused when
  // queued, those get their outcome and the rest go again.
  std::vector<std::size_t> transaction(std::span<const Event* const> events, const std::vector<std::size_t>& todo,
                                       std::vector<std::optional<Outcome>>& results, Clock::time_point deadline) {
    auto fail_all = [&](const std::string& why) {
      for (std::size_t i : todo) {
        if (!results[i]) results[i] = Outcome::retry(why);
      }
      return std::vector<std::size_t>{};
    };
    std::string error;
    if (!ensure_connected(deadline, error)) return fail_all(error);

    std::vector<std::string> streams;
    streams.reserve(todo.size());
    std::string commands;
    redis::append_command(commands, {"MULTI"});
    for (std::size_t i : todo) {
      const Event& e = *events[i];
      streams.push_back(render_stream(config.stream, e.topic));
      const std::string id = std::to_string(e.id);
      const std::string headers = headers_json(e);
      std::vector<std::string_view> args{"XADD", streams.back()};
      if (!maxlen.empty()) args.insert(args.end(), {"MAXLEN", "~", maxlen});
      args.insert(args.end(), {"*", "id", id, "topic", e.topic, "key", e.key, "payload", e.payload, "headers", headers,
                               "created_at", e.created_at});
      redis::append_command(commands, args);
    }
    redis::append_command(commands, {"EXEC"});

    const std::size_t expected = todo.size() + 2;
    auto replies = connection->roundtrip(commands, expected, deadline, error);
    last_used = Clock::now();
    if (replies.size() < expected) {
      // EXEC's answer is missing: Redis ran all of the XADDs or none. Retry all (a duplicate at worst).
      drop_connection(error);
      return fail_all(error);
    }
    if (replies[0]->type == REDIS_REPLY_ERROR) return fail_all("MULTI refused: " + reply_text(*replies[0]));

    // The answers when queued: +QUEUED, or an error that makes EXEC refuse the whole transaction.
    bool any_queue_error = false, only_permanent = true;
    std::string first_queue_error;
    for (std::size_t k = 0; k < todo.size(); ++k) {
      const redisReply& r = *replies[k + 1];
      if (r.type != REDIS_REPLY_ERROR) continue;
      any_queue_error = true;
      const std::string text = reply_text(r);
      if (first_queue_error.empty()) first_queue_error = text;
      results[todo[k]] = error_outcome(text, streams[k]);
      if (results[todo[k]]->kind != OutcomeKind::kPermanent) only_permanent = false;
    }

    const redisReply& exec = *replies.back();
    if (exec.type == REDIS_REPLY_ARRAY && exec.elements == todo.size() && !any_queue_error) {
      for (std::size_t k = 0; k < todo.size(); ++k) {
        const redisReply& r = *exec.element[k];
        if (r.type == REDIS_REPLY_STRING) {
          results[todo[k]] = Outcome::delivered();  // the new entry's id: Redis has it
        } else if (r.type == REDIS_REPLY_ERROR) {
          results[todo[k]] = error_outcome(reply_text(r), streams[k]);  // e.g. WRONGTYPE
        } else {
          results[todo[k]] = Outcome::retry("unexpected reply type " + std::to_string(r.type) + " to XADD");
        }
      }
      return {};
    }
    if (any_queue_error && only_permanent) {
      // EXECABORT: nothing ran. The refused events are dead-lettered; the others go again now.
      std::vector<std::size_t> again;
      for (std::size_t i : todo) {
        if (!results[i]) again.push_back(i);
      }
      return again;
    }
    const std::string why = exec.type == REDIS_REPLY_ERROR ? reply_text(exec) : "EXEC answered without results";
    return fail_all("transaction not run: " + why + (first_queue_error.empty() ? "" : " (" + first_queue_error + ")"));
  }

  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    std::lock_guard lock(mutex);
    const auto deadline = Clock::now() + config.timeout;
    std::vector<std::optional<Outcome>> results(events.size());
    std::vector<std::size_t> todo(events.size());
    for (std::size_t i = 0; i < todo.size(); ++i) todo[i] = i;
    // Each round either decides every event or dead-letters at least one: at most n rounds.
    while (!todo.empty()) {
      if (Clock::now() >= deadline) {
        for (std::size_t i : todo) results[i] = Outcome::retry("timeout passed before the batch was sent");
        break;
      }
      todo = transaction(events, todo, results, deadline);
    }
    std::vector<Outcome> outcomes;
    outcomes.reserve(events.size());
    for (auto& r : results) outcomes.push_back(r ? std::move(*r) : Outcome::retry("no outcome"));
    // Redis ran a transaction's XADDs in order, so the loop's hold_back_after_failures()
    // (core/key_holds.hpp) changes nothing here unless an XADD failed at run time with a
    // retriable error while a later one of its key succeeded (not seen with Redis 7: run-time
    // XADD errors are WRONGTYPE and NOPERM, both permanent).
    log_batch("redis", name(), outcomes);
    return outcomes;
  }

  bool usable() const override { return up.load(); }
};

}  // namespace

std::unique_ptr<Sink> make_redis_sink(std::string name, RedisSinkConfig config) {
  auto sink = std::make_unique<RedisSink>(std::move(name), std::move(config));
  RedisSink& s = *sink;
  // The helper reads the sink until it is stopped, as the sink's last member, before the rest.
  s.helper.start(kPingInterval, [&s] { s.beat(); });
  log::info("redis sink created", {{"sink", s.name()}, {"url", s.config.url_for_logs}, {"stream", s.config.stream}});
  return sink;
}

}  // namespace outbox::sinks
