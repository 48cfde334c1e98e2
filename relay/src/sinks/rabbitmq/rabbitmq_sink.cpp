// Publishing: a batch in id order on the confirm-mode channel, its confirms, returns and channel
// errors; the connection and the watchdog are rabbitmq_connection.{hpp,cpp}.
#include "sinks/rabbitmq/rabbitmq_sink.hpp"

#include <amqp.h>
#include <amqp_framing.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "config/duration.hpp"
#include "core/key_holds.hpp"
#include "core/periodic_thread.hpp"
#include "log/log.hpp"
#include "sinks/common/batch_log.hpp"
#include "sinks/rabbitmq/rabbitmq_connection.hpp"
#include "sinks/rabbitmq/rabbitmq_outcomes.hpp"

namespace outbox::sinks {
namespace {

using rabbitmq::bytes_of;
using rabbitmq::close_text;
using rabbitmq::kChannel;
using rabbitmq::kWatchdogGrace;
using rabbitmq::reply_text;
using rabbitmq::string_of;
using rabbitmq::timeval_of;
using SteadyClock = rabbitmq::Clock;
using std::chrono::milliseconds;

constexpr milliseconds kKeeperInterval{1000};  // between batches: notice a lost connection, reconnect
constexpr std::size_t kMaxHeaderKey = 128;     // rabbitmq-c's limit for a table key
constexpr std::size_t kMaxHeadersBytes = std::size_t{64} * 1024;  // the content header must fit in one frame
constexpr std::size_t kMaxRoutesRemembered = 65536;               // routing keys with {key} may be one per aggregate

// What a returned (unroutable) message said.
struct Returned {
  int code = 0;
  std::string text;
  std::string exchange;
  std::string routing_key;
};

// Why a round of publishing stopped before every event had an outcome.
struct Stop {
  enum Kind { kNone, kChannelClosed, kLost } kind = kNone;
  int code = 0;        // kChannelClosed: the reply code
  std::string reason;  // for last_error
};

// The sink rabbitmq_sink.hpp describes (file-local; make_rabbitmq_sink() connects it and starts
// its keeper).
struct RabbitmqSink final : public NamedSink {
  RabbitmqSink(std::string sink_name, RabbitmqSinkConfig sink_config)
      : NamedSink(std::move(sink_name)), config(std::move(sink_config)) {}

  bool reserves_header(std::string_view header) const override { return is_reserved_rabbitmq_header(header); }
  // The exchange, as OpenTelemetry's RabbitMQ conventions name the destination (the routing key
  // may hold the event's key, which spans never carry).
  const char* messaging_system() const override { return "rabbitmq"; }
  std::string destination(const Event& event) const override {
    return render_rabbitmq_template(config.exchange, event.topic, event.key);
  }

  const RabbitmqSinkConfig config;

  // Held by publish() and by the keeper between batches; the connection is used only under it.
  // The keeper holds it at most about timeout (a reconnect), so publish() waits at most that.
  std::mutex mutex;
  std::unique_ptr<rabbitmq::Connection> connection;  // null: not connected
  std::uint64_t next_tag = 1;  // the delivery tag the broker gives the next publish on the channel
  SteadyClock::time_point last_connect_attempt{};
  std::string last_connect_error;  // logged once per new error, not per attempt
  // NO_ROUTE and NOT_FOUND dead-letter an event only once the broker has settled: it has been
  // reachable for recovery_grace without a lost connection (the sink's own drop after a channel
  // error does not count), and the event's exchange and routing key have not routed a message
  // within recovery_grace (in a cluster, a node's peers forget its classic queues while it is
  // down: their routes return NO_ROUTE on a connection to another node until it is back).
  SteadyClock::time_point reachable_since{};
  bool lost = true;
  std::unordered_map<std::string, SteadyClock::time_point> routed_at;  // by route_of()

  std::atomic<bool> up{false};

  rabbitmq::Watchdog watchdog;  // bounds every blocking call on the connection's socket

  // The keeper: between batches, notices a connection the broker closed and reconnects, so
  // usable() tells the truth while no events flow (keep). Declared last: it uses everything above.
  PeriodicThread keeper;

  ~RabbitmqSink() override {
    keeper.stop();
    std::lock_guard lock(mutex);
    close_gracefully();
  }

  // --- connection (under mutex) ---

  bool connect(SteadyClock::time_point deadline) {
    last_connect_attempt = SteadyClock::now();
    std::string error;
    auto c = rabbitmq::Connection::open(config, name(), watchdog, deadline, error);
    if (!c) {
      up = false;
      lost = true;
      if (error != last_connect_error) {
        log::warn("rabbitmq: cannot connect; events retry until it can",
                  {{"sink", name()}, {"url", config.url_for_logs}, {"error", error}});
      }
      last_connect_error = error;
      return false;
    }
    connection = std::move(c);
    next_tag = 1;
    up = true;
    if (lost) reachable_since = SteadyClock::now();
    lost = false;
    last_connect_error.clear();
    log::info("rabbitmq connected", {{"sink", name()}, {"url", config.url_for_logs}, {"channel", kChannel}});
    return true;
  }

  // lost: the broker or the network ended the connection (not the sink, after a channel error).
  void drop(const std::string& why, bool lost_connection = true) {
    if (!connection) return;
    connection.reset();  // closes the socket; unconfirmed publishes are the caller's to retry
    up = false;
    if (lost_connection) lost = true;
    log::warn("rabbitmq connection dropped", {{"sink", name()}, {"reason", why}});
  }

  void close_gracefully() {
    if (!connection) return;
    connection->close_gracefully(watchdog, config.timeout);
    connection.reset();
    up = false;
  }

  // The keeper's tick. Between batches: a frame waiting (connection.close from a stopping broker)
  // or a closed socket means the connection is gone; without one, reconnect (at most once per
  // interval).
  void keep() {
    std::unique_lock lock(mutex, std::try_to_lock);
    if (!lock.owns_lock()) return;  // a batch is being published
    if (connection) {
      if (auto gone = connection->idle_check()) drop(*gone);
      return;
    }
    if (SteadyClock::now() - last_connect_attempt >= kKeeperInterval) {
      connect(SteadyClock::now() + config.timeout);
    }
  }

  // --- publishing (under mutex) ---

  // The per-batch state of one publish() call.
  struct Batch {
    std::span<const Event* const> events;
    std::vector<std::string> exchanges;
    std::vector<std::string> routing_keys;
    std::vector<std::optional<Outcome>> results;
    std::vector<std::optional<Returned>> returned;
    std::unordered_map<EventId, std::size_t> index_of;
    KeyHolds held;
    // The publishes of the current round: tag first_tag + j carried event tagged[j].
    std::uint64_t first_tag = 0;
    std::vector<std::size_t> tagged;
    std::vector<bool> confirmed;
    std::size_t lowest_unconfirmed = 0;
    std::size_t in_flight = 0;

    void set(std::size_t i, Outcome outcome) {
      if (outcome.kind == OutcomeKind::kRetry || outcome.kind == OutcomeKind::kDeferred) {
        held.hold(events[i]->key, events[i]->id);
      }
      results[i] = std::move(outcome);
    }
  };

  static std::string route_of(const std::string& exchange, const std::string& routing_key) {
    return exchange + '\0' + routing_key;
  }

  // Remembers when the batch's delivered events routed (at most kMaxRoutesRemembered routes:
  // forgetting one only makes its NO_ROUTE permanent sooner).
  void remember_routes(const Batch& b) {
    const auto now = SteadyClock::now();
    const std::string* last_exchange = nullptr;
    const std::string* last_key = nullptr;
    for (std::size_t i = 0; i < b.events.size(); ++i) {
      if (!b.results[i] || b.results[i]->kind != OutcomeKind::kDelivered) continue;
      if (last_exchange && *last_exchange == b.exchanges[i] && *last_key == b.routing_keys[i]) continue;
      last_exchange = &b.exchanges[i];
      last_key = &b.routing_keys[i];
      if (routed_at.size() >= kMaxRoutesRemembered) {
        std::erase_if(routed_at, [&](const auto& r) { return now - r.second >= config.recovery_grace; });
        if (routed_at.size() >= kMaxRoutesRemembered) routed_at.clear();
      }
      routed_at[route_of(*last_exchange, *last_key)] = now;
    }
  }

  // The outcome of the event whose publish got reply code `code` (a return, or the channel.close
  // it caused) on the given route.
  Outcome reply_outcome(int code, std::string reason, const std::string& exchange,
                        const std::string& routing_key) const {
    const auto now = SteadyClock::now();
    const auto ago = [](SteadyClock::duration d) {
      return config::format_duration(std::chrono::duration_cast<milliseconds>(d));
    };
    const std::string grace = ", less than recovery_grace " + config::format_duration(config.recovery_grace);
    std::string unsettled;  // why the broker has not settled yet, or ""
    if (now - reachable_since < config.recovery_grace) {
      unsettled = "the broker has been reachable for " + ago(now - reachable_since) + grace +
                  " (it may still be recovering its queues and bindings)";
    } else if (auto it = routed_at.find(route_of(exchange, routing_key));
               it != routed_at.end() && now - it->second < config.recovery_grace) {
      unsettled = "this exchange and routing key routed a message " + ago(now - it->second) + " ago" + grace +
                  " (a node holding its queue may be restarting)";
    }
    if (classify_amqp_reply(code, unsettled.empty()) == AmqpErrorClass::kPermanent) {
      return Outcome::permanent(std::move(reason));
    }
    if (!unsettled.empty() && classify_amqp_reply(code, true) == AmqpErrorClass::kPermanent) {
      reason += "; retried: " + unsettled;
    }
    return Outcome::retry(std::move(reason));
  }

  Outcome returned_outcome(const Returned& r) const {
    return reply_outcome(r.code,
                         std::string("returned by the broker: ") + amqp_reply_name(r.code) + " (" +
                             std::to_string(r.code) + "): " + r.text + " (exchange '" + r.exchange +
                             "', routing key '" + r.routing_key + "')",
                         r.exchange, r.routing_key);
  }

  void confirm(Batch& b, std::uint64_t tag, bool multiple, bool ack) {
    if (tag < b.first_tag) return;
    const std::size_t last = static_cast<std::size_t>(tag - b.first_tag);
    if (last >= b.tagged.size()) return;
    const std::size_t from = multiple ? b.lowest_unconfirmed : last;
    for (std::size_t j = from; j <= last; ++j) {
      if (b.confirmed[j]) continue;
      b.confirmed[j] = true;
      --b.in_flight;
      const std::size_t i = b.tagged[j];
      if (b.results[i]) continue;  // decided in an earlier round
      if (b.returned[i]) {
        b.set(i, returned_outcome(*b.returned[i]));
      } else if (ack) {
        b.set(i, Outcome::delivered());
      } else {
        b.set(i, Outcome::retry("nacked by the broker (basic.nack): it could not take the message"));
      }
    }
    while (b.lowest_unconfirmed < b.confirmed.size() && b.confirmed[b.lowest_unconfirmed]) ++b.lowest_unconfirmed;
  }

  // Reads one frame (waiting until deadline) and applies it. Returns a stop, or kNone.
  Stop read_one(Batch& b, SteadyClock::time_point deadline) {
    amqp_connection_state_t c = connection->state();
    amqp_frame_t frame;
    timeval tv = timeval_of(deadline - SteadyClock::now());
    const int rc = amqp_simple_wait_frame_noblock(c, &frame, &tv);
    if (rc == AMQP_STATUS_TIMEOUT) {
      return {Stop::kLost, 0, "no publisher confirm within timeout " + config::format_duration(config.timeout)};
    }
    if (rc != AMQP_STATUS_OK) return {Stop::kLost, 0, std::string("connection lost: ") + amqp_error_string2(rc)};
    Stop stop;
    if (frame.frame_type == AMQP_FRAME_METHOD) {
      const amqp_method_t& method = frame.payload.method;
      switch (method.id) {
        case AMQP_BASIC_ACK_METHOD: {
          const auto* m = static_cast<const amqp_basic_ack_t*>(method.decoded);
          confirm(b, m->delivery_tag, m->multiple != 0, true);
          break;
        }
        case AMQP_BASIC_NACK_METHOD: {
          const auto* m = static_cast<const amqp_basic_nack_t*>(method.decoded);
          confirm(b, m->delivery_tag, m->multiple != 0, false);
          break;
        }
        case AMQP_BASIC_RETURN_METHOD: {
          // The returned message follows (header and body frames); its message_id names the event.
          // The broker sends the basic.ack of that publish after it.
          const auto* m = static_cast<const amqp_basic_return_t*>(method.decoded);
          Returned r{m->reply_code, string_of(m->reply_text), string_of(m->exchange), string_of(m->routing_key)};
          amqp_message_t message;
          const amqp_rpc_reply_t read = amqp_read_message(c, frame.channel, &message, 0);
          if (read.reply_type != AMQP_RESPONSE_NORMAL) {
            stop = {Stop::kLost, 0, "reading a returned message failed: " + reply_text(read)};
            break;
          }
          EventId id = 0;
          const std::string message_id = (message.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG)
                                             ? string_of(message.properties.message_id)
                                             : std::string();
          amqp_destroy_message(&message);
          const auto [end, ec] = std::from_chars(message_id.data(), message_id.data() + message_id.size(), id);
          if (ec != std::errc() || end != message_id.data() + message_id.size()) break;
          if (auto it = b.index_of.find(id); it != b.index_of.end()) b.returned[it->second] = std::move(r);
          break;
        }
        case AMQP_CHANNEL_CLOSE_METHOD: {
          const auto* m = static_cast<const amqp_channel_close_t*>(method.decoded);
          stop = {Stop::kChannelClosed, m->reply_code, close_text("channel", m->reply_code, m->reply_text)};
          break;
        }
        case AMQP_CONNECTION_CLOSE_METHOD: {
          const auto* m = static_cast<const amqp_connection_close_t*>(method.decoded);
          stop = {Stop::kLost, m->reply_code, close_text("connection", m->reply_code, m->reply_text)};
          break;
        }
        default: break;  // connection.blocked/unblocked and the like: the deadline bounds a blocked batch
      }
    }
    amqp_maybe_release_buffers(c);
    return stop;
  }

  // The headers table of one event; nullopt (with why) when the row's headers cannot be sent.
  static std::optional<std::string> build_headers(const Event& e, const std::string& id,
                                                  std::vector<amqp_table_entry_t>& entries) {
    entries.clear();
    auto add = [&](const std::string& key, const std::string& value) {
      amqp_table_entry_t entry{};
      entry.key = bytes_of(key);
      entry.value.kind = AMQP_FIELD_KIND_UTF8;
      entry.value.value.bytes = bytes_of(value);
      entries.push_back(entry);
    };
    static const std::string kId = "outbox-id", kTopic = "outbox-topic", kKey = "outbox-key",
                             kCreatedAt = "outbox-created-at";
    add(kId, id);
    add(kTopic, e.topic);
    add(kKey, e.key);
    add(kCreatedAt, e.created_at);
    std::size_t total = 0;
    for (const auto& [header, value] : e.headers) {
      if (header.empty() || header.size() > kMaxHeaderKey) {
        return "header name '" + header.substr(0, 40) + "' is empty or longer than 128 bytes (AMQP table key)";
      }
      total += header.size() + value.size() + 6;
      if (total > kMaxHeadersBytes) return "the row's headers exceed 64 KiB (they travel in one AMQP frame)";
      add(header, value);
    }
    return std::nullopt;
  }

  // Publishes the undecided events in id order, at most window without a confirm, then reads
  // until each published event is confirmed. Events of a key with an earlier failure are
  // deferred, not sent.
  Stop round(Batch& b, std::size_t window, SteadyClock::time_point deadline) {
    amqp_connection_state_t c = connection->state();
    b.first_tag = next_tag;
    b.tagged.clear();
    b.confirmed.clear();
    b.lowest_unconfirmed = 0;
    b.in_flight = 0;
    std::vector<amqp_table_entry_t> entries;
    Stop stop;
    for (std::size_t i = 0; i < b.events.size() && stop.kind == Stop::kNone; ++i) {
      if (b.results[i]) continue;
      const Event& e = *b.events[i];
      if (b.held.holds(e)) {
        b.set(i, Outcome::deferred());
        continue;
      }
      const std::string id = std::to_string(e.id);
      if (auto bad = build_headers(e, id, entries)) {
        b.set(i, Outcome::permanent(*bad));
        continue;
      }
      amqp_basic_properties_t props{};
      props._flags = AMQP_BASIC_CONTENT_TYPE_FLAG | AMQP_BASIC_DELIVERY_MODE_FLAG | AMQP_BASIC_MESSAGE_ID_FLAG |
                     AMQP_BASIC_TIMESTAMP_FLAG | AMQP_BASIC_APP_ID_FLAG | AMQP_BASIC_HEADERS_FLAG;
      props.content_type = amqp_cstring_bytes("application/json");
      props.delivery_mode = AMQP_DELIVERY_PERSISTENT;
      props.message_id = bytes_of(id);
      props.timestamp = static_cast<std::uint64_t>(std::max<std::int64_t>(0, e.created_at_us / 1'000'000));
      props.app_id = amqp_cstring_bytes("outbox-relay");
      props.headers = amqp_table_t{static_cast<int>(entries.size()), entries.data()};
      const int rc = amqp_basic_publish(c, kChannel, bytes_of(b.exchanges[i]), bytes_of(b.routing_keys[i]),
                                        /*mandatory=*/1, /*immediate=*/0, &props, bytes_of(e.payload));
      if (rc != AMQP_STATUS_OK) {
        stop = {Stop::kLost, 0, std::string("publish failed: ") + amqp_error_string2(rc)};
        break;
      }
      ++next_tag;
      b.tagged.push_back(i);
      b.confirmed.push_back(false);
      ++b.in_flight;
      while (stop.kind == Stop::kNone && b.in_flight >= window) stop = read_one(b, deadline);
    }
    while (stop.kind == Stop::kNone && b.in_flight > 0) stop = read_one(b, deadline);
    return stop;
  }

  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    const auto started = SteadyClock::now();
    const auto deadline = started + config.timeout;
    Batch b;
    b.events = events;
    const std::size_t n = events.size();
    b.results.resize(n);
    b.returned.resize(n);
    b.exchanges.resize(n);
    b.routing_keys.resize(n);
    for (std::size_t i = 0; i < n; ++i) {
      const Event& e = *events[i];
      b.index_of.emplace(e.id, i);
      b.exchanges[i] = render_rabbitmq_template(config.exchange, e.topic, e.key);
      b.routing_keys[i] = render_rabbitmq_template(config.routing_key, e.topic, e.key);
      if (b.exchanges[i].size() > kMaxAmqpShortString) {
        b.results[i] =
            Outcome::permanent("exchange name from template '" + config.exchange + "' is longer than 255 bytes");
      } else if (b.routing_keys[i].size() > kMaxAmqpShortString) {
        b.results[i] =
            Outcome::permanent("routing key from template '" + config.routing_key + "' is longer than 255 bytes");
      }
    }

    std::unique_lock lock(mutex);
    std::string failure;
    // A channel error (e.g. a missing exchange, a message over the broker's size limit) closes
    // the channel at the publish that caused it and drops the publishes after it. The sink then
    // sends the undecided events one at a time until the one that closes the channel again is
    // found (its reply code classifies it), and goes on pipelined after it.
    bool one_at_a_time = false;
    std::size_t rounds = 0;
    while (failure.empty()) {
      if (std::all_of(b.results.begin(), b.results.end(), [](const auto& r) { return r.has_value(); })) break;
      if (SteadyClock::now() >= deadline) {
        failure = "no publisher confirm within timeout " + config::format_duration(config.timeout);
        break;
      }
      if (!connection && !connect(deadline)) {
        failure = "not connected: " + last_connect_error;
        break;
      }
      ++rounds;
      watchdog.arm(connection->fd(), deadline + kWatchdogGrace);
      const std::size_t window = one_at_a_time ? 1 : static_cast<std::size_t>(config.max_in_flight);
      Stop stop = round(b, window, deadline);
      if (watchdog.disarm() && stop.kind == Stop::kNone) {
        stop = {Stop::kLost, 0, "the socket outlived timeout and was shut down"};
      }
      if (stop.kind == Stop::kNone) continue;
      if (stop.kind == Stop::kChannelClosed) {
        // One at a time, the one in flight caused it; pipelined, anything unconfirmed may have.
        if (one_at_a_time && b.in_flight == 1) {
          const std::size_t culprit = b.tagged.back();
          b.set(culprit, reply_outcome(stop.code, stop.reason, b.exchanges[culprit], b.routing_keys[culprit]));
          one_at_a_time = false;
        } else {
          one_at_a_time = true;
        }
        drop(stop.reason, /*lost_connection=*/false);
        continue;
      }
      failure = stop.reason;
      drop(stop.reason);
    }
    // publish() must never return with a connection whose publishes are unconfirmed: a late
    // confirm would be read as one of the next batch's.
    if (!failure.empty()) drop(failure);
    remember_routes(b);
    lock.unlock();

    std::vector<Outcome> outcomes;
    outcomes.reserve(n);
    for (std::size_t i = 0; i < n; ++i) {
      outcomes.push_back(b.results[i] ? std::move(*b.results[i]) : Outcome::retry(failure));
    }
    const double ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - started).count();
    if (!log_batch("rabbitmq", name(), outcomes, {{"rounds", rounds}, {"ms", ms}})) {
      log::debug("rabbitmq batch confirmed", {{"sink", name()}, {"events", outcomes.size()}, {"ms", ms}});
    }
    return outcomes;
  }

  bool usable() const override { return up.load(); }
};

}  // namespace

std::unique_ptr<Sink> make_rabbitmq_sink(std::string name, RabbitmqSinkConfig config) {
  auto sink = std::make_unique<RabbitmqSink>(std::move(name), std::move(config));
  RabbitmqSink& s = *sink;
  {
    std::lock_guard lock(s.mutex);
    s.connect(SteadyClock::now() + s.config.timeout);
  }
  s.keeper.start(kKeeperInterval, [&s] { s.keep(); });  // ~RabbitmqSink stops it first
  return sink;
}

}  // namespace outbox::sinks
