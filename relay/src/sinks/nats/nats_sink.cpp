#include "sinks/nats/nats_sink.hpp"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdint>
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
constexpr std::size_t kNoNext = static_cast<std::size_t>(-1);

// Per key, in id order: next[i] = the index of the next event of events[i]'s key (kNoNext for the
// last); `first` gets the first event of each key. Returns how many events have one before them.
std::size_t chain_keys(std::span<const Event* const> events, std::vector<std::size_t>& next,
                       std::deque<std::size_t>& first) {
  next.assign(events.size(), kNoNext);
  std::unordered_map<std::string_view, std::size_t> last;  // key -> its latest event so far
  last.reserve(events.size());
  std::size_t behind = 0;
  for (std::size_t i = 0; i < events.size(); ++i) {
    const auto [it, fresh] = last.try_emplace(events[i]->key, i);
    if (fresh) {
      first.push_back(i);
    } else {
      next[it->second] = i;
      it->second = i;
      ++behind;
    }
  }
  return behind;
}

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

  // A PubAck (or its failure) as the handler saw it, for collect() to decide on.
  struct Ack {
    std::uint64_t submission = 0;  // Submission::seq
    std::size_t index = 0;
    natsStatus status = NATS_OK;
    int js_code = 0;
    std::string text;
    bool duplicate = false;
  };
  // What nats.c holds of ours: the event a published message carries.
  struct Tag {
    std::uint64_t submission = 0;
    std::size_t index = 0;
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
  // mutex, and the atomic above. submit() and collect() never hold mutex while they call nats.c.
  std::mutex mutex;
  std::condition_variable changed;
  bool closed = false;                                // the closed callback ran: nats.c calls nothing of ours after it
  std::unordered_map<const natsMsg*, Tag> in_flight;  // published, PubAck not handled
  std::vector<Ack> acks;                              // handled, not yet taken by collect()
  int settling = 0;  // collect() waits for the handlers of a submission's reclaimed messages
  // What collect() sleeps for: the PubAcks of submission `awaited` not reported yet, and whether
  // any PubAck may let more out (a key's next event, or a ready event the window held back).
  // Without the latter it sleeps until the last of its submission's: one wake-up a batch.
  std::uint64_t awaited = 0;
  std::size_t awaited_left = 0;
  bool wake_each = true;

  // One submit()'s events, from submit() until its collect() returns. Only the thread calling
  // submit() and collect() (one at a time) touches these. Per-key order within one: a key's
  // events wait (chained by `next`, id order) while one of them is published and not yet
  // answered; `ready` holds the events that may go now, the first of each key to begin with. An
  // event releases the next of its key when it is decided delivered or permanent (a dead letter
  // releases its key, docs/design.md §4); a retry leaves the key's later events unsent
  // (kDeferred). Two submissions never share a key (Sink::submit()), so keys are per submission.
  struct Submission {
    std::uint64_t seq = 0;
    std::span<const Event* const> events;
    SteadyClock::time_point started{};
    SteadyClock::time_point deadline{};  // started + timeout: no publish after it, collect() waits until it
    std::string refused;                 // not sent at all (no connection at submit()): every event retries
    std::vector<std::optional<Outcome>> results;
    std::vector<char> sent;         // published and not taken back (close_submission())
    std::vector<std::size_t> next;  // the next event of the same key, or kNoNext
    std::size_t queued = 0;         // events behind an earlier one of their key, not yet ready
    std::deque<std::size_t> ready;
    std::size_t outstanding = 0;  // published, PubAck not taken yet
    std::size_t duplicates = 0;
  };
  std::deque<Submission> submissions;  // oldest first (references stay valid: only the ends change)
  std::uint64_t next_seq = 1;
  std::vector<Ack> taken;  // take_acks()'s scratch

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
    if (it == in_flight.end()) return;  // not ours to decide any more (see close_submission)
    Ack ack;
    ack.submission = it->second.submission;
    ack.index = it->second.index;
    if (pae) {
      ack.status = pae->Err == NATS_OK ? NATS_ERR : pae->Err;
      ack.js_code = static_cast<int>(pae->ErrCode);
      ack.text = pae->ErrText ? pae->ErrText : "";
    } else {
      ack.duplicate = pa && pa->Duplicate;
    }
    in_flight.erase(it);
    const bool last = ack.submission == awaited && awaited_left > 0 && --awaited_left == 0;
    acks.push_back(std::move(ack));
    // collect() waits for a first PubAck to take, for the last of its submission's, or (settling)
    // for a submission's handlers to finish.
    if ((wake_each && acks.size() == 1) || last || settling > 0) changed.notify_all();
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
    js_options.PublishAsync.MaxPending = config.max_in_flight;  // the sink keeps below it anyway
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
  std::optional<Outcome> send(std::uint64_t submission, std::size_t index, const Event& event) {
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
    // No MaxWait: collect() keeps the deadline itself and takes unanswered messages back
    // (close_submission). nats.c would otherwise queue a timeout notice per message, answered or not.
    const natsMsg* tag = msg.get();
    {
      std::lock_guard lock(mutex);
      in_flight.insert_or_assign(tag, Tag{submission, index});  // before publishing: the PubAck may beat the call
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

  // --- submissions (the calling thread's) ---

  Submission* find(std::uint64_t seq) {
    for (Submission& s : submissions) {
      if (s.seq == seq) return &s;
    }
    return nullptr;
  }

  std::size_t outstanding() const {
    std::size_t n = 0;
    for (const Submission& s : submissions) n += s.outstanding;
    return n;
  }

  static void release_next(Submission& s, std::size_t i) {
    if (s.next[i] == kNoNext) return;
    s.ready.push_back(s.next[i]);
    --s.queued;
  }

  void decide(const Ack& ack) {
    Submission* s = find(ack.submission);
    if (s == nullptr) return;  // its submission was collected (a handler that did not settle in time)
    --s->outstanding;
    auto& result = s->results[ack.index];
    if (ack.status == NATS_OK) {
      result = Outcome::delivered();
      if (ack.duplicate) ++s->duplicates;
    } else {
      result = outcome_for(ack.status, ack.js_code, ack.text);
    }
    if (result->kind != OutcomeKind::kRetry) release_next(*s, ack.index);
  }

  // Decides the PubAcks the handlers reported so far.
  void take_acks() {
    {
      std::lock_guard lock(mutex);
      taken.swap(acks);
    }
    for (const Ack& ack : taken) decide(ack);
    taken.clear();
  }

  // Publishes s's ready events while fewer than max_in_flight publishes (of every submission)
  // wait for their PubAck, the connection is up and s's deadline has not passed.
  void pump(Submission& s) {
    if (!s.refused.empty()) return;
    const auto max_in_flight = static_cast<std::size_t>(config.max_in_flight);
    std::size_t in_flight_now = outstanding();
    while (in_flight_now < max_in_flight && !s.ready.empty() && connected && SteadyClock::now() < s.deadline) {
      const std::size_t i = s.ready.front();
      s.ready.pop_front();
      auto failed = send(s.seq, i, *s.events[i]);
      if (!failed) {
        s.sent[i] = 1;
        ++s.outstanding;
        ++in_flight_now;
        continue;
      }
      s.results[i] = std::move(*failed);
      if (s.results[i]->kind != OutcomeKind::kRetry) release_next(s, i);
    }
  }

  // Ends s's wait: takes back what nats.c still waits a PubAck for (so no handler reports s's
  // messages later), waits for handlers already past nats.c, and decides the PubAcks they
  // reported. The messages it takes back of later submissions are published again (the same
  // Nats-Msg-Id: a duplicate at worst, dropped by JetStream): they are put back at the front of
  // their submission's ready events, the head of their key, so per-key order holds.
  void close_submission(Submission& s) {
    take_acks();
    if (s.outstanding == 0) return;
    natsMsgList pending{};
    if (js_PublishAsyncGetPendingList(&pending, js.get()) == NATS_OK) {
      std::vector<Tag> again;  // of later submissions
      {
        std::lock_guard lock(mutex);
        for (int k = 0; k < pending.Count; ++k) {
          const auto it = in_flight.find(pending.Msgs[k]);
          if (it == in_flight.end()) continue;
          if (it->second.submission != s.seq) again.push_back(it->second);
          in_flight.erase(it);
        }
      }
      natsMsgList_Destroy(&pending);  // destroys the reclaimed messages
      for (const Tag& tag : again) {
        Submission* other = find(tag.submission);
        if (other == nullptr) continue;
        --other->outstanding;
        other->sent[tag.index] = 0;
        other->ready.push_front(tag.index);
      }
    }
    std::unique_lock lock(mutex);
    const auto mine = [&] {
      return std::any_of(in_flight.begin(), in_flight.end(),
                         [&](const auto& f) { return f.second.submission == s.seq; });
    };
    ++settling;
    const bool settled = changed.wait_for(lock, kSettleWait, [&] { return !mine(); });
    --settling;
    if (!settled) {
      std::size_t left = 0;
      for (auto it = in_flight.begin(); it != in_flight.end();) {
        if (it->second.submission == s.seq) {
          it = in_flight.erase(it);
          ++left;
        } else {
          ++it;
        }
      }
      log::error("nats: PubAck handlers did not settle; their events retry", {{"sink", name()}, {"events", left}});
    }
    lock.unlock();
    take_acks();
  }

  bool pipelined() const override { return true; }

  void submit(std::span<const Event* const> events) override {
    Submission& s = submissions.emplace_back();
    s.seq = next_seq++;
    s.events = events;
    s.started = SteadyClock::now();
    s.deadline = s.started + config.timeout;
    const std::size_t n = events.size();
    s.results.resize(n);
    s.sent.assign(n, 0);
    if (!connected) {
      s.refused = "not connected to NATS at " + config.url_for_logs;
      return;
    }
    s.queued = chain_keys(events, s.next, s.ready);
    pump(s);
  }

  std::vector<Outcome> collect() override {
    if (submissions.empty()) return {};
    Submission& s = submissions.front();
    const std::size_t n = s.events.size();
    SteadyClock::time_point answered = s.started;
    if (s.refused.empty()) {
      for (;;) {
        take_acks();
        for (Submission& each : submissions) pump(each);  // the oldest first: this one
        const auto now = SteadyClock::now();
        if (now >= s.deadline) break;
        if (s.outstanding == 0 && (s.ready.empty() || !connected)) break;  // all decided, or nothing may be sent
        // Waits for a PubAck: one of s's, or of a later submission's that frees the window.
        const bool more = std::any_of(submissions.begin(), submissions.end(),
                                      [](const Submission& each) { return each.queued > 0 || !each.ready.empty(); });
        std::unique_lock lock(mutex);
        wake_each = more;
        awaited = s.seq;
        awaited_left = s.outstanding;
        for (const Ack& ack : acks) awaited_left -= ack.submission == s.seq ? 1 : 0;
        changed.wait_until(lock, s.deadline, [&] { return more ? !acks.empty() : awaited_left == 0; });
        awaited = 0;
        wake_each = true;
      }
      answered = SteadyClock::now();
      close_submission(s);
    }

    // What is still undecided: published without a PubAck (retry), or never published: behind a
    // failed event of its key, or because the deadline passed or the connection went (kDeferred:
    // not attempted, claimed again; a sink still down then answers retry at once, in submit()).
    std::vector<Outcome> outcomes;
    outcomes.reserve(n);
    const std::string no_ack = "no PubAck within timeout " + config::format_duration(config.timeout);
    const std::string not_sent = std::string("not sent: ") +
                                 (connected ? "the batch reached the sink timeout" : "the connection to NATS was lost");
    KeyHolds held;
    for (std::size_t i = 0; i < n; ++i) {
      const Event& event = *s.events[i];
      auto& result = s.results[i];
      if (!result) {
        if (!s.refused.empty()) {
          result = Outcome::retry(s.refused);
        } else if (s.sent[i]) {
          result = Outcome::retry(no_ack);
        } else if (held.holds(event)) {
          result = Outcome::deferred();
        } else {
          result = Outcome{OutcomeKind::kDeferred, not_sent, std::nullopt};
        }
      }
      if (result->kind == OutcomeKind::kRetry || result->kind == OutcomeKind::kDeferred) {
        held.hold(event.key, event.id);
      }
      outcomes.push_back(std::move(*result));
    }
    if (s.duplicates > 0) {
      log::info("nats: JetStream reported re-sent events as duplicates (already stored; counted delivered)",
                {{"sink", name()}, {"duplicates", s.duplicates}});
    }
    log_batch("nats", name(), outcomes);
    log::debug("nats batch published",
               {{"sink", name()},
                {"events", n},
                {"duplicates", s.duplicates},
                {"acks_ms", std::chrono::duration<double, std::milli>(answered - s.started).count()}});
    submissions.pop_front();
    return outcomes;
  }

  std::vector<Outcome> publish(std::span<const Event* const> events) override {
    submit(events);
    return collect();
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
