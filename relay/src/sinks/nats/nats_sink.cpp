#include "sinks/nats/nats_sink.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <deque>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <unordered_map>

#include "config/duration.hpp"
#include "config/section.hpp"
#include "core/key_holds.hpp"
#include "log/log.hpp"
#include "sinks/common/batch_log.hpp"
#include "sinks/common/c_handle.hpp"
#include "sinks/nats/cnats.hpp"
#include "sinks/nats/nats_outcomes.hpp"

namespace outbox::sinks {
namespace {

using SteadyClock = std::chrono::steady_clock;
using std::chrono::milliseconds;

constexpr milliseconds kReconnectWait{500};    // between reconnect attempts (nats.c adds jitter)
constexpr milliseconds kPingInterval{10'000};  // a silent dead peer is noticed after two of these
constexpr int kMaxPingsOut = 2;
// After reclaiming the unanswered publishes of a batch: PubAck handlers that took their message
// out of nats.c just before are about to report it; they never block, so this is a bound only.
constexpr milliseconds kSettleWait{1'000};
constexpr milliseconds kCloseWait{5'000};  // for nats.c's closed callback, the last one it makes

using OptionsPtr = CHandle<natsOptions, &natsOptions_Destroy>;
using ConnectionPtr = CHandle<natsConnection, &natsConnection_Destroy>;
using JetStreamPtr = CHandle<jsCtx, &jsCtx_Destroy>;
using MessagePtr = CHandle<natsMsg, &natsMsg_Destroy>;

// nats.c's description of the last error on this thread, with registered secrets masked.
std::string last_error() { return log::redact(nats_GetLastError(nullptr)); }

// The sink nats_sink.hpp describes (file-local; make_nats_sink() connects it).
struct NatsSink final : public NamedSink {
  NatsSink(std::string sink_name, NatsSinkConfig sink_config)
      : NamedSink(std::move(sink_name)), config(std::move(sink_config)) {}

  // A PubAck (or its failure) as the handler saw it, for publish() to decide on.
  struct Ack {
    std::size_t index = 0;
    natsStatus status = NATS_OK;
    int js_code = 0;
    std::string text;
    bool duplicate = false;
  };

  bool reserves_header(std::string_view header) const override { return is_reserved_nats_header(header); }
  // Not a value of OpenTelemetry's list (which has none for NATS): the sink type.
  const char* messaging_system() const override { return "nats"; }
  std::string destination(const Event& event) const override { return render_subject(config.subject, event.topic); }

  const NatsSinkConfig config;
  std::atomic<bool> connected{false};
  std::atomic<bool> closing{false};  // the sink is being destroyed: a disconnect is expected

  // nats.c calls the handlers below on its own threads (PubAcks on the reply subscription's
  // thread, connection events on its callback thread). They touch only these members, under
  // mutex, and the atomic above. publish() never holds mutex while it calls nats.c.
  std::mutex mutex;
  std::condition_variable changed;
  bool closed = false;  // the closed callback ran: nats.c calls nothing of ours after it
  std::unordered_map<const natsMsg*, std::size_t> in_flight;  // published, PubAck not handled
  std::vector<Ack> acks;                                      // handled, not yet taken by publish()

  OptionsPtr options;
  ConnectionPtr connection;
  JetStreamPtr js;

  ~NatsSink() override {
    if (connection) {
      // Close first and wait for the closed callback: nats.c's threads are detached, so this is
      // how we know none of them calls into this object any more.
      closing = true;
      natsConnection_Close(connection.get());
      std::unique_lock lock(mutex);
      if (!changed.wait_for(lock, kCloseWait, [&] { return closed; })) {
        log::warn("nats: the connection did not report closed in time", {{"sink", name()}});
      }
    }
    js.reset();
    connection.reset();
    options.reset();
  }

  // --- nats.c callbacks (closure = NatsSink*) ---

  static void on_ack(jsCtx* /*js*/, natsMsg* msg, jsPubAck* pa, jsPubAckErr* pae, void* closure) {
    static_cast<NatsSink*>(closure)->pub_ack(msg, pa, pae);
    natsMsg_Destroy(msg);  // the handler owns the message (nats.c's contract for AckHandler)
  }
  static void on_connected(natsConnection* /*nc*/, void* closure) {
    auto* self = static_cast<NatsSink*>(closure);
    self->connected = true;
    log::info("nats: connected", {{"sink", self->name()}, {"url", self->config.url_for_logs}});
  }
  static void on_reconnected(natsConnection* /*nc*/, void* closure) {
    auto* self = static_cast<NatsSink*>(closure);
    self->connected = true;
    log::info("nats: reconnected", {{"sink", self->name()}, {"url", self->config.url_for_logs}});
  }
  static void on_disconnected(natsConnection* /*nc*/, void* closure) {
    auto* self = static_cast<NatsSink*>(closure);
    self->connected = false;
    if (self->closing) return;
    log::warn("nats: disconnected; reconnecting", {{"sink", self->name()}, {"url", self->config.url_for_logs}});
  }
  static void on_closed(natsConnection* /*nc*/, void* closure) {
    auto* self = static_cast<NatsSink*>(closure);
    self->connected = false;
    std::lock_guard lock(self->mutex);
    self->closed = true;
    self->changed.notify_all();
  }
  static void on_error(natsConnection* /*nc*/, natsSubscription* /*sub*/, natsStatus err, void* closure) {
    auto* self = static_cast<NatsSink*>(closure);
    log::warn("nats: asynchronous error", {{"sink", self->name()}, {"error", natsStatus_GetText(err)}});
  }

  void pub_ack(const natsMsg* msg, const jsPubAck* pa, const jsPubAckErr* pae) {
    std::lock_guard lock(mutex);
    const auto it = in_flight.find(msg);
    if (it == in_flight.end()) return;  // not ours to decide any more (cannot happen, see close_batch)
    Ack ack;
    ack.index = it->second;
    if (pae) {
      ack.status = pae->Err == NATS_OK ? NATS_ERR : pae->Err;
      ack.js_code = static_cast<int>(pae->ErrCode);
      ack.text = pae->ErrText ? pae->ErrText : "";
    } else {
      ack.duplicate = pa && pa->Duplicate;
    }
    in_flight.erase(it);
    acks.push_back(std::move(ack));
    // The waiters wait for a first PubAck to take (publish) or for the last one (close_batch).
    if (acks.size() == 1 || in_flight.empty()) changed.notify_all();
  }

  // --- connection ---

  void connect() {
    const std::string here = config.key_path.empty() ? name() : config.key_path;
    auto check = [&](natsStatus s, const std::string& key, const char* what) {
      if (s != NATS_OK) throw config::ConfigError(key + ": " + what + ": " + last_error());
    };
    natsOptions* raw_options = nullptr;
    check(natsOptions_Create(&raw_options), here, "cannot create NATS options");
    options.reset(raw_options);
    natsOptions* o = options.get();
    check(natsOptions_SetURL(o, config.url.c_str()), here + ".url", "rejected by nats.c");
    std::string lower = config.url;
    std::transform(lower.begin(), lower.end(), lower.begin(),
                   [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
    if (lower.find("tls://") != std::string::npos) {
      check(natsOptions_SetSecure(o, true), here + ".url", "cannot enable TLS");
    }
    check(natsOptions_SetName(o, "outbox-relay"), here, "natsOptions_SetName");
    check(natsOptions_SetTimeout(o, config.timeout.count()), here + ".timeout", "natsOptions_SetTimeout");
    check(natsOptions_SetMaxReconnect(o, -1), here, "natsOptions_SetMaxReconnect");
    check(natsOptions_SetReconnectWait(o, kReconnectWait.count()), here, "natsOptions_SetReconnectWait");
    check(natsOptions_SetPingInterval(o, kPingInterval.count()), here, "natsOptions_SetPingInterval");
    check(natsOptions_SetMaxPingsOut(o, kMaxPingsOut), here, "natsOptions_SetMaxPingsOut");
    check(natsOptions_SetRetryOnFailedConnect(o, true, &NatsSink::on_connected, this), here,
          "natsOptions_SetRetryOnFailedConnect");
    check(natsOptions_SetDisconnectedCB(o, &NatsSink::on_disconnected, this), here, "natsOptions_SetDisconnectedCB");
    check(natsOptions_SetReconnectedCB(o, &NatsSink::on_reconnected, this), here, "natsOptions_SetReconnectedCB");
    check(natsOptions_SetClosedCB(o, &NatsSink::on_closed, this), here, "natsOptions_SetClosedCB");
    check(natsOptions_SetErrorHandler(o, &NatsSink::on_error, this), here, "natsOptions_SetErrorHandler");

    natsConnection* nc = nullptr;
    const natsStatus s = natsConnection_Connect(&nc, o);
    if (s == NATS_OK) {
      connected = true;
    } else if (s == NATS_NOT_YET_CONNECTED) {
      log::warn("nats: no server reachable yet; connecting in the background",
                {{"sink", name()}, {"url", config.url_for_logs}});
    } else {
      if (nc) natsConnection_Destroy(nc);
      throw config::ConfigError(here + ".url: cannot connect to " + config.url_for_logs + ": " + last_error());
    }
    connection.reset(nc);

    jsOptions js_options;
    check(jsOptions_Init(&js_options), here, "jsOptions_Init");
    js_options.Wait = config.timeout.count();
    js_options.PublishAsync.MaxPending = config.max_in_flight;  // publish() keeps below it anyway
    js_options.PublishAsync.StallWait = config.timeout.count();
    js_options.PublishAsync.AckHandler = &NatsSink::on_ack;
    js_options.PublishAsync.AckHandlerClosure = this;
    jsCtx* raw_js = nullptr;
    check(natsConnection_JetStream(&raw_js, nc, &js_options), here, "cannot create the JetStream context");
    js.reset(raw_js);
  }

  // --- publishing ---

  Outcome outcome_for(natsStatus status, int js_code, const std::string& text) const {
    std::string reason;
    if (js_code != 0) {
      reason = "JetStream error " + std::to_string(js_code) + ": " + text;
    } else {
      reason = natsStatus_GetText(status);
      if (!text.empty() && text != natsStatus_GetText(status)) reason += ": " + text;
    }
    const bool no_stream_permanent = config.no_stream == NatsNoStream::kPermanent;
    return classify_nats_error(status, js_code, no_stream_permanent) == NatsErrorClass::kPermanent
               ? Outcome::permanent(std::move(reason))
               : Outcome::retry(std::move(reason));
  }

  // Publishes one event asynchronously. nullopt: nats.c has it and its PubAck will come to
  // pub_ack(); otherwise the event's outcome (it was not published).
  std::optional<Outcome> send(std::size_t index, const Event& event) {
    const std::string subject = render_subject(config.subject, event.topic);
    if (!valid_nats_subject(subject)) {
      return Outcome::permanent("invalid NATS subject '" + subject + "' from subject template '" + config.subject +
                                "' (tokens separated by '.', no spaces, no wildcards '*' or '>')");
    }
    if (!valid_nats_header_value(event.topic) || !valid_nats_header_value(event.key)) {
      return Outcome::permanent("the event's topic or key contains CR or LF, which NATS headers cannot carry");
    }
    natsMsg* raw = nullptr;
    natsStatus s =
        natsMsg_Create(&raw, subject.c_str(), nullptr, event.payload.data(), static_cast<int>(event.payload.size()));
    if (s != NATS_OK) return outcome_for(s, 0, last_error());
    MessagePtr msg(raw);
    const std::string id = std::to_string(event.id);
    s = natsMsgHeader_Set(msg.get(), "outbox-id", id.c_str());
    if (s == NATS_OK) s = natsMsgHeader_Set(msg.get(), "outbox-topic", event.topic.c_str());
    if (s == NATS_OK) s = natsMsgHeader_Set(msg.get(), "outbox-key", event.key.c_str());
    if (s == NATS_OK) s = natsMsgHeader_Set(msg.get(), "outbox-created-at", event.created_at.c_str());
    for (const auto& [header, value] : event.headers) {
      if (s != NATS_OK) break;
      if (!valid_nats_header_name(header)) {
        return Outcome::permanent("row header '" + header +
                                  "' cannot be a NATS header name (printable ASCII without ':' or spaces)");
      }
      if (!valid_nats_header_value(value)) {
        return Outcome::permanent("the value of row header '" + header +
                                  "' contains CR, LF or NUL, which NATS headers cannot carry");
      }
      s = natsMsgHeader_Add(msg.get(), header.c_str(), value.c_str());
    }
    if (s != NATS_OK) return outcome_for(s, 0, last_error());

    jsPubOptions pub;
    jsPubOptions_Init(&pub);
    pub.MsgId = id.c_str();  // the Nats-Msg-Id header: JetStream's de-duplication key
    // No MaxWait: publish() keeps the deadline itself and takes unanswered messages back
    // (close_batch). nats.c would otherwise queue a timeout notice per message, answered or not.
    const natsMsg* tag = msg.get();
    {
      std::lock_guard lock(mutex);
      in_flight.emplace(tag, index);  // before publishing: the PubAck may beat the call's return
    }
    raw = msg.release();
    s = js_PublishMsgAsync(js.get(), &raw, &pub);
    if (s == NATS_OK) return std::nullopt;  // nats.c owns the message now (raw is null)
    msg.reset(raw);
    {
      std::lock_guard lock(mutex);
      in_flight.erase(tag);  // a failed call means no PubAck handler for it (nats.c's contract)
    }
    return outcome_for(s, 0, last_error());
  }

  // Ends a batch: takes back what nats.c still waits a PubAck for (so no handler can report it
  // later), waits for handlers already past nats.c, and returns the PubAcks not taken yet.
  std::vector<Ack> close_batch() {
    bool unanswered = false;
    {
      std::lock_guard lock(mutex);
      unanswered = !in_flight.empty();
    }
    if (unanswered) {
      natsMsgList pending{};
      if (js_PublishAsyncGetPendingList(&pending, js.get()) == NATS_OK) {
        std::lock_guard lock(mutex);
        for (int k = 0; k < pending.Count; ++k) in_flight.erase(pending.Msgs[k]);
      }
      natsMsgList_Destroy(&pending);  // destroys the reclaimed messages: they are never sent again
    }
    std::unique_lock lock(mutex);
    if (!changed.wait_for(lock, kSettleWait, [&] { return in_flight.empty(); })) {
      log::error("nats: PubAck handlers did not settle; their events retry",
                 {{"sink", name()}, {"events", in_flight.size()}});
      in_flight.clear();
    }
    std::vector<Ack> late;
    late.swap(acks);
    return late;
  }

  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    const std::size_t n = events.size();
    if (!connected) {
      return std::vector<Outcome>(n, Outcome::retry("not connected to NATS at " + config.url_for_logs));
    }
    const auto started = SteadyClock::now();
    const auto deadline = started + config.timeout;
    const std::size_t max_in_flight = static_cast<std::size_t>(config.max_in_flight);

    // Per-key order: a key's events wait in `waiting` (id order) while one of them is in flight;
    // `ready` holds the events that may go now, the first of each key to begin with. An event
    // releases the next of its key when it is decided delivered or permanent (a dead letter
    // releases its key, docs/design.md §4); a retry leaves the key's later events unsent
    // (kDeferred).
    std::unordered_map<std::string_view, std::deque<std::size_t>> waiting;
    std::deque<std::size_t> ready;
    for (std::size_t i = 0; i < n; ++i) {
      auto [it, first] = waiting.try_emplace(events[i]->key);
      if (first) {
        ready.push_back(i);
      } else {
        it->second.push_back(i);
      }
    }
    auto release_next = [&](std::size_t i) {
      auto& queue = waiting[events[i]->key];
      if (queue.empty()) return;
      ready.push_back(queue.front());
      queue.pop_front();
    };

    std::vector<std::optional<Outcome>> results(n);
    std::vector<char> sent(n, 0);
    std::size_t outstanding = 0, duplicates = 0;
    auto decide = [&](const Ack& ack) {
      if (ack.status == NATS_OK) {
        results[ack.index] = Outcome::delivered();
        if (ack.duplicate) ++duplicates;
      } else {
        results[ack.index] = outcome_for(ack.status, ack.js_code, ack.text);
      }
      if (results[ack.index]->kind != OutcomeKind::kRetry) release_next(ack.index);
    };

    {
      std::lock_guard lock(mutex);
      in_flight.clear();
      acks.clear();
    }
    std::vector<Ack> taken;
    for (;;) {
      while (outstanding < max_in_flight && !ready.empty() && connected && SteadyClock::now() < deadline) {
        const std::size_t i = ready.front();
        ready.pop_front();
        auto failed = send(i, *events[i]);
        if (!failed) {
          sent[i] = 1;
          ++outstanding;
          continue;
        }
        results[i] = std::move(*failed);
        if (results[i]->kind != OutcomeKind::kRetry) release_next(i);
      }
      if (outstanding == 0) break;  // all decided, or nothing more may be sent
      {
        std::unique_lock lock(mutex);
        changed.wait_until(lock, deadline, [&] { return !acks.empty(); });
        taken.swap(acks);
      }
      for (const auto& ack : taken) {
        --outstanding;
        decide(ack);
      }
      taken.clear();
      if (SteadyClock::now() >= deadline) break;
    }
    const auto answered = SteadyClock::now();
    for (const auto& ack : close_batch()) decide(ack);

    // What is still undecided: published without a PubAck (retry), or never published: behind a
    // failed event of its key, or because the deadline passed or the connection went (kDeferred:
    // not attempted, claimed again; a sink still down then answers retry at once, above).
    std::vector<Outcome> outcomes;
    outcomes.reserve(n);
    const std::string no_ack = "no PubAck within timeout " + config::format_duration(config.timeout);
    const std::string not_sent = std::string("not sent: ") +
                                 (connected ? "the batch reached the sink timeout" : "the connection to NATS was lost");
    KeyHolds held;
    for (std::size_t i = 0; i < n; ++i) {
      const Event& event = *events[i];
      if (!results[i]) {
        if (sent[i]) {
          results[i] = Outcome::retry(no_ack);
        } else if (held.holds(event)) {
          results[i] = Outcome::deferred();
        } else {
          results[i] = Outcome{OutcomeKind::kDeferred, not_sent, std::nullopt};
        }
      }
      if (results[i]->kind == OutcomeKind::kRetry || results[i]->kind == OutcomeKind::kDeferred) {
        held.hold(event.key, event.id);
      }
      outcomes.push_back(std::move(*results[i]));
    }
    if (duplicates > 0) {
      log::info("nats: JetStream reported re-sent events as duplicates (already stored; counted delivered)",
                {{"sink", name()}, {"duplicates", duplicates}});
    }
    log_batch("nats", name(), outcomes);
    log::debug("nats batch published",
               {{"sink", name()},
                {"events", n},
                {"duplicates", duplicates},
                {"acks_ms", std::chrono::duration<double, std::milli>(answered - started).count()}});
    return outcomes;
  }

  bool usable() const override { return connected.load(); }

  void flush(milliseconds timeout) override {
    if (!connection || !connected) return;
    if (natsConnection_FlushTimeout(connection.get(), std::max<long long>(1, timeout.count())) != NATS_OK) {
      log::warn("nats: flush did not complete", {{"sink", name()}, {"error", last_error()}});
    }
  }
};

}  // namespace

std::unique_ptr<Sink> make_nats_sink(std::string name, NatsSinkConfig config) {
  auto sink = std::make_unique<NatsSink>(std::move(name), std::move(config));
  sink->connect();  // on a whole sink: if it throws, ~NatsSink closes what it opened
  log::info("nats connection created", {{"sink", sink->name()},
                                        {"url", sink->config.url_for_logs},
                                        {"subject", sink->config.subject},
                                        {"connected", sink->connected.load()},
                                        {"nats.c", nats_GetVersion()}});
  return sink;
}

}  // namespace outbox::sinks
