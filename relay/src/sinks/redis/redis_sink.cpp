#include "sinks/redis/redis_sink.hpp"

#include <atomic>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "core/key_holds.hpp"
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

// The sink redis_sink.hpp describes (file-local; make_redis_sink() starts its helper thread).
struct RedisSink final : public NamedSink {
  RedisSink(std::string sink_name, RedisSinkConfig sink_config)
      : NamedSink(std::move(sink_name)),
        config(std::move(sink_config)),
        maxlen(config.maxlen ? std::to_string(*config.maxlen) : ""),
        one_stream(config.stream.find("{topic}") == std::string::npos) {}

  // Not a value of OpenTelemetry's list: the sink type.
  const char* messaging_system() const override { return "redis"; }
  std::string destination(const Event& event) const override { return render_stream(config.stream, event.topic); }

  const RedisSinkConfig config;
  const std::string maxlen;
  const bool one_stream;  // the stream template names no {topic}: every event goes to one stream

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

  // The helper thread's tick: connects while nobody publishes, and PINGs an idle connection, so
  // usable() tells the truth between batches and a dead connection is noticed before a batch.
  void beat() {
    std::unique_lock lock(mutex);
    if (!queue.empty()) return;  // transactions in flight: their replies come first, and show the link
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

  // One MULTI/XADD.../EXEC transaction of a submission, sent (submit()) and not yet answered.
  // Redis answers the commands of one connection in order, so the replies of the transactions in
  // `queue` arrive in its order. The loop never has events of one key in two transactions at once
  // (Sink::submit()), so a transaction sent again (below) may go behind later ones.
  struct Transaction {
    std::span<const Event* const> events;
    std::vector<std::size_t> todo;  // the indices in events this transaction carries (id order)
    std::vector<std::size_t> rest;  // the indices not yet sent: a later transaction (next_part())
    std::vector<std::string> streams;
    std::vector<std::optional<Outcome>> results;  // per event of the submission
    Clock::time_point deadline;
    std::size_t expected = 0;       // replies it owes: MULTI, one per XADD, EXEC
    std::string error;              // not sent, or its connection was lost before its replies
    std::vector<ReplyPtr> replies;  // read (read = true), perhaps early
    bool read = false;
  };
  std::deque<Transaction> queue;  // under mutex; oldest first

  // Under mutex. Marks every transaction whose replies are lost with the connection.
  void drop_connection(const std::string& why) {
    connection.reset();
    set_up(false, why);
    for (Transaction& t : queue) {
      if (!t.read && t.error.empty()) t.error = why;
    }
  }

  // Under mutex. Sends t's XADDs for t.todo in a transaction; on failure sets t.error.
  void send(Transaction& t) {
    t.read = false;
    t.replies.clear();
    t.error.clear();
    std::string error;
    if (!ensure_connected(t.deadline, error)) {
      t.error = error;
      return;
    }
    t.streams.clear();
    t.streams.reserve(t.todo.size());
    std::string commands;
    redis::append_command(commands, {"MULTI"});
    for (std::size_t i : t.todo) {
      const Event& e = *t.events[i];
      t.streams.push_back(render_stream(config.stream, e.topic));
      const std::string id = std::to_string(e.id);
      const std::string headers = headers_to_json(e.headers);
      std::vector<std::string_view> args{"XADD", t.streams.back()};
      if (!maxlen.empty()) args.insert(args.end(), {"MAXLEN", "~", maxlen});
      args.insert(args.end(), {"*", "id", id, "topic", e.topic, "key", e.key, "payload", e.payload, "headers", headers,
                               "created_at", e.created_at});
      redis::append_command(commands, args);
    }
    redis::append_command(commands, {"EXEC"});
    t.expected = t.todo.size() + 2;
    const bool sent = connection->send(commands, t.expected, t.deadline, error);
    last_used = Clock::now();
    if (!sent) {
      // Perhaps some of it ran: every event retries (a duplicate at worst).
      drop_connection(error);
      t.error = error;
    }
  }

  // Under mutex. Reads t's replies (those before it are read). On failure sets t.error.
  void read_replies(Transaction& t) {
    if (t.read || !t.error.empty()) return;
    if (!connection) {
      t.error = "connection lost";
      return;
    }
    std::string error;
    auto replies = connection->receive(t.expected, t.deadline, error);
    last_used = Clock::now();
    if (replies.size() < t.expected) {
      // EXEC's answer is missing: Redis ran all of the XADDs or none. Retry all (a duplicate at worst).
      drop_connection(error);
      t.error = error;
      return;
    }
    t.replies = std::move(replies);
    t.read = true;
  }

  // Decides t.results for every event of t.todo from its replies, except events that must be sent
  // again at once (returned): when EXEC was refused only because some XADDs were permanently
  // refused when queued, those get their outcome and the rest go again.
  std::vector<std::size_t> decide(Transaction& t) {
    auto fail_all = [&](const std::string& why) {
      for (std::size_t i : t.todo) {
        if (!t.results[i]) t.results[i] = Outcome::retry(why);
      }
      return std::vector<std::size_t>{};
    };
    if (!t.error.empty()) return fail_all(t.error);
    const auto& replies = t.replies;
    const auto& todo = t.todo;
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
      t.results[todo[k]] = error_outcome(text, t.streams[k]);
      if (t.results[todo[k]]->kind != OutcomeKind::kPermanent) only_permanent = false;
    }

    const redisReply& exec = *replies.back();
    if (exec.type == REDIS_REPLY_ARRAY && exec.elements == todo.size() && !any_queue_error) {
      for (std::size_t k = 0; k < todo.size(); ++k) {
        const redisReply& r = *exec.element[k];
        if (r.type == REDIS_REPLY_STRING) {
          t.results[todo[k]] = Outcome::delivered();  // the new entry's id: Redis has it
        } else if (r.type == REDIS_REPLY_ERROR) {
          t.results[todo[k]] = error_outcome(reply_text(r), t.streams[k]);  // e.g. WRONGTYPE
        } else {
          t.results[todo[k]] = Outcome::retry("unexpected reply type " + std::to_string(r.type) + " to XADD");
        }
      }
      return {};
    }
    if (any_queue_error && only_permanent) {
      // EXECABORT: nothing ran. The refused events are dead-lettered; the others go again now.
      std::vector<std::size_t> again;
      for (std::size_t i : todo) {
        if (!t.results[i]) again.push_back(i);
      }
      return again;
    }
    const std::string why = exec.type == REDIS_REPLY_ERROR ? reply_text(exec) : "EXEC answered without results";
    return fail_all("transaction not run: " + why + (first_queue_error.empty() ? "" : " (" + first_queue_error + ")"));
  }

  // Picks the next part of a submission from t.rest into t.todo: up to (not including) the first
  // event whose key already has an event in this part bound for another stream. Redis runs the
  // XADDs of an EXEC one by one, and one may fail at run time while the others run (ERR: the
  // stream has exhausted the last possible id; WRONGTYPE, NOPERM): a later event of the key in
  // another stream would then be written before the earlier one is retried. In one stream the
  // later XADD fails the same way. So a key's events go to a second stream only in the next part,
  // sent after this part's answer; there, events whose key was retried or deferred are deferred
  // (core/key_holds.hpp's rule). False when nothing is left to send.
  bool next_part(Transaction& t) {
    KeyHolds failed;
    for (std::size_t i = 0; i < t.results.size(); ++i) {
      const auto& r = t.results[i];
      if (r && (r->kind == OutcomeKind::kRetry || r->kind == OutcomeKind::kDeferred)) {
        failed.hold(t.events[i]->key, t.events[i]->id);
      }
    }
    t.todo.clear();
    std::unordered_map<std::string_view, std::string> stream_of_key;
    std::size_t k = 0;
    for (; k < t.rest.size(); ++k) {
      const std::size_t i = t.rest[k];
      const Event& e = *t.events[i];
      if (failed.holds(e)) {
        t.results[i] = Outcome::deferred();
        continue;
      }
      if (one_stream) {
        t.todo.push_back(i);
        continue;
      }
      std::string stream = render_stream(config.stream, e.topic);
      const auto [it, fresh] = stream_of_key.try_emplace(e.key, std::move(stream));
      if (!fresh && it->second != render_stream(config.stream, e.topic)) break;
      t.todo.push_back(i);
    }
    t.rest.erase(t.rest.begin(), t.rest.begin() + static_cast<std::ptrdiff_t>(k));
    return !t.todo.empty();
  }

  bool pipelined() const override { return true; }

  void submit(std::span<const Event* const> events) override {
    std::lock_guard lock(mutex);
    Transaction& t = queue.emplace_back();
    t.events = events;
    t.rest.resize(events.size());
    for (std::size_t i = 0; i < events.size(); ++i) t.rest[i] = i;
    t.results.resize(events.size());
    t.deadline = Clock::now() + config.timeout;
    if (next_part(t)) send(t);
  }

  std::vector<Outcome> collect() override {
    std::lock_guard lock(mutex);
    if (queue.empty()) return {};
    Transaction& t = queue.front();
    // Each round decides every event of a part, or dead-letters at least one and sends the rest
    // again: at most n rounds.
    while (!t.todo.empty()) {
      read_replies(t);
      auto again = decide(t);
      if (again.empty() && t.rest.empty()) break;
      if (Clock::now() >= t.deadline) {
        for (std::size_t i : again) t.results[i] = Outcome::retry("timeout passed before the batch was sent");
        for (std::size_t i : t.rest) t.results[i] = Outcome::retry("timeout passed before the batch was sent");
        break;
      }
      // Sent behind the transactions queued after it, whose replies come first. Their keys are
      // not this submission's (Sink::submit()).
      for (std::size_t q = 1; q < queue.size(); ++q) read_replies(queue[q]);
      if (!again.empty()) {
        t.todo = std::move(again);
      } else if (!next_part(t)) {
        break;
      }
      send(t);
    }
    std::vector<Outcome> outcomes;
    outcomes.reserve(t.results.size());
    for (auto& r : t.results) outcomes.push_back(r ? std::move(*r) : Outcome::retry("no outcome"));
    queue.pop_front();
    // Redis ran a transaction's XADDs in order, and a key's events in one transaction go to one
    // stream (next_part()), so the loop's hold_back_after_failures() (core/key_holds.hpp) finds
    // nothing to change here.
    log_batch("redis", name(), outcomes);
    return outcomes;
  }

  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    submit(events);
    return collect();
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
