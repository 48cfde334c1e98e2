// Publishing: the submissions on the confirm-mode channel, one unconfirmed event per key, their
// confirms (rabbitmq_confirms.hpp), returns and channel errors; the connection and the watchdog
// are rabbitmq_connection.{hpp,cpp}.
#include "sinks/rabbitmq/rabbitmq_sink.hpp"

#include <amqp.h>
#include <amqp_framing.h>

#include <algorithm>
#include <atomic>
#include <charconv>
#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <unordered_map>

#include "config/duration.hpp"
#include "core/key_holds.hpp"
#include "core/periodic_thread.hpp"
#include "log/log.hpp"
#include "sinks/common/batch_log.hpp"
#include "sinks/rabbitmq/rabbitmq_confirms.hpp"
#include "sinks/rabbitmq/rabbitmq_connection.hpp"
#include "sinks/rabbitmq/rabbitmq_outcomes.hpp"

namespace outbox::sinks {
namespace {

using rabbitmq::bytes_of;
using rabbitmq::close_text;
using rabbitmq::kChannel;
using rabbitmq::kWatchdogGrace;
using rabbitmq::Publish;
using rabbitmq::reply_text;
using rabbitmq::string_of;
using rabbitmq::timeval_of;
using SteadyClock = rabbitmq::Clock;
using std::chrono::milliseconds;

constexpr milliseconds kKeeperInterval{1000};  // between batches: notice a lost connection, reconnect
constexpr std::size_t kMaxHeaderKey = 128;     // rabbitmq-c's limit for a table key
constexpr std::size_t kMaxHeadersBytes = std::size_t{64} * 1024;  // the content header must fit in one frame
constexpr std::size_t kMaxRoutesRemembered = 65536;               // routing keys with {key} may be one per aggregate
constexpr std::size_t kNoNext = static_cast<std::size_t>(-1);     // Submission::next: the last of its key

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

  // Held by submit(), collect() and by the keeper between batches; the connection is used only
  // under it. The keeper holds it at most about timeout (a reconnect), so they wait at most that.
  std::mutex mutex;
  std::unique_ptr<rabbitmq::Connection> connection;  // null: not connected
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
    ++connection_number;
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
    if (!lock.owns_lock()) return;     // a batch is being published
    if (!submissions.empty()) return;  // confirms outstanding: collect() reads the connection
    if (connection) {
      if (auto gone = connection->idle_check()) drop(*gone);
      return;
    }
    if (SteadyClock::now() - last_connect_attempt >= kKeeperInterval) {
      connect(SteadyClock::now() + config.timeout);
    }
  }

  // --- publishing (under mutex) ---

  // One submit()'s events, from submit() until its collect() returns. Per-key order within one
  // (key_order confirm): a key's events wait (chained by `next`, id order) while one of them is
  // published and not yet confirmed; `ready` holds the events that may be published now, the
  // first of each key to begin with. A confirm that decides an event delivered or permanent
  // releases the next of its key; a retry leaves the key's later events unsent (kDeferred).
  // key_order channel: every event is ready at once, in id order, and one of a key with an
  // earlier retried event is not published (kDeferred; `held`). Two submissions never share a key
  // (Sink::submit()), so keys are per submission.
  struct Submission {
    std::uint64_t seq = 0;
    std::span<const Event* const> events;
    SteadyClock::time_point started{};
    SteadyClock::time_point deadline{};  // started + timeout: collect() waits until it
    std::vector<std::string> exchanges;
    std::vector<std::string> routing_keys;
    std::vector<std::optional<Outcome>> results;
    std::vector<std::optional<Returned>> returned;
    std::vector<std::size_t> next;  // the next event of the same key (key_order confirm), or kNoNext
    std::deque<std::size_t> ready;
    KeyHolds held;                      // keys with a retried or deferred event
    std::vector<char> suspect;          // unconfirmed when a channel error closed the channel (one_at_a_time)
    std::size_t in_flight = 0;          // published on the channel, not confirmed
    std::size_t connections = 0;        // the connections its events were published on (for the log)
    std::uint64_t last_connection = 0;  // connection_number when it last published
    // Set: nothing more is published of it; its undecided events retry with this reason.
    std::string failure;
  };
  std::deque<Submission> submissions;  // oldest first (references stay valid: only the ends change)
  std::uint64_t next_seq = 1;
  std::uint64_t connection_number = 0;  // counts connect()s, for Submission::connections
  rabbitmq::Confirms confirms;          // the channel's unconfirmed publishes, by delivery tag
  // A channel error closed the channel and the broker dropped what it had not confirmed; which
  // publish caused it is not in the error. Until the culprit is found (the channel closes again
  // with one publish outstanding) or every suspect is decided, one publish at a time.
  bool one_at_a_time = false;
  std::size_t suspects = 0;
  std::vector<amqp_table_entry_t> header_entries;                 // pump()'s scratch
  std::unordered_map<std::string_view, std::size_t> key_scratch;  // submit()'s: a key's latest event

  Submission* find(std::uint64_t seq) {
    for (Submission& s : submissions) {
      if (s.seq == seq) return &s;
    }
    return nullptr;
  }

  void set(Submission& s, std::size_t i, Outcome outcome) {
    if (s.suspect[i]) {
      s.suspect[i] = 0;
      if (--suspects == 0) one_at_a_time = false;  // the culprit was among the delivered: go on pipelined
    }
    const bool releases = outcome.kind == OutcomeKind::kDelivered || outcome.kind == OutcomeKind::kPermanent;
    if (!releases) s.held.hold(s.events[i]->key, s.events[i]->id);
    s.results[i] = std::move(outcome);
    if (releases && s.next[i] != kNoNext) s.ready.push_back(s.next[i]);
  }

  void clear_suspects() {
    for (Submission& s : submissions) std::fill(s.suspect.begin(), s.suspect.end(), 0);
    suspects = 0;
    one_at_a_time = false;
  }

  // Ends every submission still publishing: nothing more of it is published, and its undecided
  // events retry with `why` (those behind a retried event of their key are deferred).
  void fail_all(const std::string& why) {
    for (Publish p : confirms.take_all()) {
      if (Submission* s = find(p.submission)) --s->in_flight;
    }
    for (Submission& s : submissions) {
      if (s.failure.empty()) s.failure = why;
    }
    clear_suspects();
  }

  static std::string route_of(const std::string& exchange, const std::string& routing_key) {
    return exchange + '\0' + routing_key;
  }

  // Remembers when the submission's delivered events routed (at most kMaxRoutesRemembered
  // routes: forgetting one only makes its NO_ROUTE permanent sooner).
  void remember_routes(const Submission& b) {
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

  // basic.ack (ack) or basic.nack of `tag`, for one publish or (multiple) every one up to it.
  void confirm(std::uint64_t tag, bool multiple, bool ack) {
    confirms.confirm(tag, multiple, [&](Publish p) {
      Submission* s = find(p.submission);
      if (s == nullptr) return;  // cannot happen: a submission is collected with nothing on the channel
      --s->in_flight;
      const std::size_t i = p.index;
      if (s->results[i]) return;
      if (s->returned[i]) {
        set(*s, i, returned_outcome(*s->returned[i]));
      } else if (ack) {
        set(*s, i, Outcome::delivered());
      } else {
        set(*s, i, Outcome::retry("nacked by the broker (basic.nack): it could not take the message"));
      }
    });
  }

  // A basic.return: the returned message follows (header and body frames); its message_id names
  // the event. The broker sends the basic.ack of that publish after it.
  Stop read_return(const amqp_basic_return_t& m, amqp_channel_t channel) {
    Returned r{m.reply_code, string_of(m.reply_text), string_of(m.exchange), string_of(m.routing_key)};
    amqp_message_t message;
    const amqp_rpc_reply_t read = amqp_read_message(connection->state(), channel, &message, 0);
    if (read.reply_type != AMQP_RESPONSE_NORMAL) {
      return {Stop::kLost, 0, "reading a returned message failed: " + reply_text(read)};
    }
    EventId id = 0;
    const std::string message_id = (message.properties._flags & AMQP_BASIC_MESSAGE_ID_FLAG)
                                       ? string_of(message.properties.message_id)
                                       : std::string();
    amqp_destroy_message(&message);
    const auto [end, ec] = std::from_chars(message_id.data(), message_id.data() + message_id.size(), id);
    if (ec != std::errc() || end != message_id.data() + message_id.size()) return {};
    // Event ids are unique among the submissions on the channel; each has its events in id order.
    for (Submission& s : submissions) {
      const auto it = std::lower_bound(s.events.begin(), s.events.end(), id,
                                       [](const Event* e, EventId want) { return e->id < want; });
      if (it != s.events.end() && (*it)->id == id) {
        s.returned[static_cast<std::size_t>(it - s.events.begin())] = std::move(r);
        break;
      }
    }
    return {};
  }

  // Reads one frame (waiting until deadline) and applies it. Returns a stop, or kNone.
  Stop read_one(SteadyClock::time_point deadline) {
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
          confirm(m->delivery_tag, m->multiple != 0, true);
          break;
        }
        case AMQP_BASIC_NACK_METHOD: {
          const auto* m = static_cast<const amqp_basic_nack_t*>(method.decoded);
          confirm(m->delivery_tag, m->multiple != 0, false);
          break;
        }
        case AMQP_BASIC_RETURN_METHOD:
          stop = read_return(*static_cast<const amqp_basic_return_t*>(method.decoded), frame.channel);
          break;
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

  // Publishes s's ready events while the channel has fewer than the window's publishes without a
  // confirm (every submission's: max_in_flight, or one at a time) and s's deadline has not passed.
  // Needs a connection. Returns a stop when a publish failed (the connection is then lost).
  Stop pump(Submission& s) {
    if (!s.failure.empty() || s.ready.empty()) return {};
    const std::size_t window = one_at_a_time ? 1 : static_cast<std::size_t>(config.max_in_flight);
    amqp_connection_state_t c = connection->state();
    if (s.last_connection != connection_number) {
      s.last_connection = connection_number;
      ++s.connections;
    }
    while (!s.ready.empty() && confirms.outstanding() < window && SteadyClock::now() < s.deadline) {
      const std::size_t i = s.ready.front();
      s.ready.pop_front();
      if (s.results[i]) continue;
      const Event& e = *s.events[i];
      if (s.held.holds(e)) {  // key_order channel: an earlier event of its key was retried
        set(s, i, Outcome::deferred());
        continue;
      }
      const std::string id = std::to_string(e.id);
      if (auto bad = build_headers(e, id, header_entries)) {
        set(s, i, Outcome::permanent(*bad));
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
      props.headers = amqp_table_t{static_cast<int>(header_entries.size()), header_entries.data()};
      const int rc = amqp_basic_publish(c, kChannel, bytes_of(s.exchanges[i]), bytes_of(s.routing_keys[i]),
                                        /*mandatory=*/1, /*immediate=*/0, &props, bytes_of(e.payload));
      if (rc != AMQP_STATUS_OK) {
        // Perhaps partly written: the connection goes, and the event retries with the rest.
        s.ready.push_front(i);
        return {Stop::kLost, 0, std::string("publish failed: ") + amqp_error_string2(rc)};
      }
      confirms.add(Publish{s.seq, i});
      ++s.in_flight;
    }
    return {};
  }

  // After a stop: a channel error sends the channel's unconfirmed publishes again (their events
  // back at the head of their key's queue), one at a time until the one that closes the channel
  // again is found; anything else ends every submission (its undecided events retry).
  void on_stop(const Stop& stop) {
    if (stop.kind != Stop::kChannelClosed) {
      drop(stop.reason);
      fail_all(stop.reason);
      return;
    }
    std::vector<Publish> unconfirmed = confirms.take_all();
    if (one_at_a_time && unconfirmed.size() == 1) {
      // One at a time, the one in flight caused it.
      if (Submission* s = find(unconfirmed.front().submission)) {
        --s->in_flight;
        const std::size_t i = unconfirmed.front().index;
        set(*s, i, reply_outcome(stop.code, stop.reason, s->exchanges[i], s->routing_keys[i]));
      }
      clear_suspects();  // the others were dropped only because they came after it
    } else {
      // Pipelined, anything unconfirmed may have caused it. Back to the front, in tag order.
      for (auto it = unconfirmed.rbegin(); it != unconfirmed.rend(); ++it) {
        Submission* s = find(it->submission);
        if (s == nullptr) continue;
        --s->in_flight;
        s->ready.push_front(it->index);
        if (!s->suspect[it->index]) {
          s->suspect[it->index] = 1;
          ++suspects;
        }
      }
      one_at_a_time = suspects > 0;
    }
    drop(stop.reason, /*lost_connection=*/false);
  }

  bool pipelined() const override { return true; }

  void submit(std::span<const Event* const> events) override {
    std::lock_guard lock(mutex);
    Submission& s = submissions.emplace_back();
    s.seq = next_seq++;
    s.events = events;
    s.started = SteadyClock::now();
    s.deadline = s.started + config.timeout;
    const std::size_t n = events.size();
    s.results.resize(n);
    s.returned.resize(n);
    s.exchanges.resize(n);
    s.routing_keys.resize(n);
    s.suspect.assign(n, 0);
    s.next.assign(n, kNoNext);
    key_scratch.clear();
    for (std::size_t i = 0; i < n; ++i) {
      const Event& e = *events[i];
      s.exchanges[i] = render_rabbitmq_template(config.exchange, e.topic, e.key);
      s.routing_keys[i] = render_rabbitmq_template(config.routing_key, e.topic, e.key);
      if (s.exchanges[i].size() > kMaxAmqpShortString) {
        s.results[i] =
            Outcome::permanent("exchange name from template '" + config.exchange + "' is longer than 255 bytes");
        continue;  // dead-lettered now: it does not hold its key
      }
      if (s.routing_keys[i].size() > kMaxAmqpShortString) {
        s.results[i] =
            Outcome::permanent("routing key from template '" + config.routing_key + "' is longer than 255 bytes");
        continue;
      }
      if (config.key_order == RabbitmqKeyOrder::kChannel) {
        s.ready.push_back(i);
        continue;
      }
      const auto [it, first] = key_scratch.try_emplace(e.key, i);
      if (first) {
        s.ready.push_back(i);
      } else {
        s.next[it->second] = i;
        it->second = i;
      }
    }
    if (!connection && !connect(s.deadline)) {
      s.failure = "not connected: " + last_connect_error;
      return;
    }
    watchdog.arm(connection->fd(), s.deadline + kWatchdogGrace);
    Stop stop = pump(s);
    if (watchdog.disarm() && stop.kind == Stop::kNone) {
      stop = {Stop::kLost, 0, "the socket outlived timeout and was shut down"};
    }
    if (stop.kind != Stop::kNone) on_stop(stop);
  }

  std::vector<Outcome> collect() override {
    std::unique_lock lock(mutex);
    if (submissions.empty()) return {};
    Submission& s = submissions.front();
    const std::size_t n = s.events.size();
    // Each turn publishes what may go (this submission's first, then the later ones'), then reads
    // one frame. Ends when every event of s is decided or held behind a retry of its key, or s
    // failed (a lost connection, timeout: every submission fails, the connection goes, so no late
    // confirm is mistaken for another publish's). The watchdog is armed while the loop uses the
    // socket, and disarmed before the socket is closed (drop()).
    bool armed = false;
    const auto disarm = [&] {
      const bool tripped = armed && watchdog.disarm();
      armed = false;
      return tripped;
    };
    const std::string tripped_why = "the socket outlived timeout and was shut down";
    while (s.failure.empty() && (s.in_flight > 0 || !s.ready.empty())) {
      if (SteadyClock::now() >= s.deadline) {
        disarm();
        const std::string why = "no publisher confirm within timeout " + config::format_duration(config.timeout);
        if (s.in_flight > 0) {
          drop(why);
          fail_all(why);
        } else {
          s.failure = why;
        }
        break;
      }
      if (!connection && !connect(s.deadline)) {
        fail_all("not connected: " + last_connect_error);
        break;
      }
      if (!armed) {
        watchdog.arm(connection->fd(), s.deadline + kWatchdogGrace);
        armed = true;
      }
      Stop stop;
      for (Submission& each : submissions) {
        stop = pump(each);
        if (stop.kind != Stop::kNone) break;
      }
      if (stop.kind == Stop::kNone && confirms.outstanding() > 0) stop = read_one(s.deadline);
      if (stop.kind == Stop::kNone) continue;
      if (disarm() && stop.kind == Stop::kLost) stop.reason = tripped_why;
      on_stop(stop);
    }
    if (disarm()) {
      // Shut down after the last frame s needed: the connection is gone for the later submissions.
      drop(tripped_why);
      fail_all(tripped_why);
    }
    remember_routes(s);

    // Undecided: published and not confirmed when s failed (retry), or not published: behind a
    // retried event of its key (deferred), or because s failed (retry, as every sink does for a
    // batch it could not send; all of them when none of it was published: no connection).
    std::vector<Outcome> outcomes;
    outcomes.reserve(n);
    KeyHolds held;
    const bool sent_none = s.connections == 0;
    for (std::size_t i = 0; i < n; ++i) {
      const Event& e = *s.events[i];
      if (!s.results[i]) {
        set(s, i,
            held.holds(e) && !sent_none ? Outcome::deferred()
                                        : Outcome::retry(s.failure.empty() ? "not sent" : s.failure));
      }
      if (s.results[i]->kind == OutcomeKind::kRetry || s.results[i]->kind == OutcomeKind::kDeferred) {
        held.hold(e.key, e.id);
      }
      outcomes.push_back(std::move(*s.results[i]));
    }
    const double ms = std::chrono::duration<double, std::milli>(SteadyClock::now() - s.started).count();
    const std::size_t connections = s.connections;
    submissions.pop_front();
    lock.unlock();
    if (!log_batch("rabbitmq", name(), outcomes, {{"connections", connections}, {"ms", ms}})) {
      log::debug("rabbitmq batch confirmed", {{"sink", name()}, {"events", outcomes.size()}, {"ms", ms}});
    }
    return outcomes;
  }

  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    submit(events);
    return collect();
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
